"""Hugging Face ``Trainer`` with a tiny GPT-2, saving every few steps and resuming by itself.

    python chaos/examples/frameworks/hf_trainer.py --out DIR [--steps 8] [--save-steps 2]
    torchrun --standalone --nproc-per-node 2 --max-restarts 1 chaos/examples/frameworks/hf_trainer.py --out DIR

Written as the Trainer docs and ``examples/pytorch/language-modeling/run_clm.py`` show:
``TrainingArguments(output_dir=..., save_steps=..., save_total_limit=...)`` and, when the
output directory already holds a ``checkpoint-N`` folder, ``trainer.train(
resume_from_checkpoint=True)`` (the Trainer then picks the newest ``checkpoint-N``
itself). The model is a 1-layer GPT-2 built from a ``GPT2Config`` (no download), trained
on seeded random tokens with dropout on, so the RNG states in the checkpoint matter.
At the end ``trainer.save_model(DIR/final)`` writes ``final/model.safetensors``: the
result file ``chaos run --result-file final/model.safetensors`` compares.

Under ``torchrun`` the Trainer runs DDP over gloo on CPU (rank 0 writes the model and
trainer state, every rank its own ``rng_state_R.pth``).
"""

import argparse
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

try:  # chaos probe (optional): a no-op outside `chaos run`
    from chaos import probe
except ImportError:
    probe = None


class RandomTokens(torch.utils.data.Dataset):
    """Seeded random token sequences; the labels are the inputs (causal LM)."""

    def __init__(self, n: int, length: int, vocab: int) -> None:
        gen = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, vocab, (n, length), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class ProbeCallback(TrainerCallback):
    """chaos probe (optional): steps, acknowledged saves and the resume point, from Trainer events."""

    def on_train_begin(self, args, state, control, **kwargs):
        if probe and state.global_step > 0:
            probe.resumed(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if probe:
            probe.step(state.global_step)

    def on_save(self, args, state, control, **kwargs):
        if probe:  # on_save runs after the checkpoint folder was written
            probe.saved(state.global_step)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-steps", type=int, default=2)
    ap.add_argument("--save-total-limit", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    training_args = TrainingArguments(
        output_dir=args.out,
        max_steps=args.steps,
        save_steps=args.save_steps,
        save_total_limit=args.save_total_limit,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        seed=0,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    torch.manual_seed(training_args.seed)
    model = GPT2LMHeadModel(config)
    trainer = Trainer(model=model, args=training_args, train_dataset=RandomTokens(64, 16, config.vocab_size),
                      callbacks=[ProbeCallback()])

    # As run_clm.py does: resume when the output directory already holds a checkpoint.
    has_checkpoint = os.path.isdir(args.out) and any(
        d.startswith("checkpoint-") for d in os.listdir(args.out))
    trainer.train(resume_from_checkpoint=True if has_checkpoint else None)
    trainer.save_model(os.path.join(args.out, "final"))


if __name__ == "__main__":
    main()
