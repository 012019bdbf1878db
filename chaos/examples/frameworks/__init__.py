"""Small real training jobs written the way each framework's own docs show, for ``chaos run -- COMMAND``.

One script per framework, each CPU-only, seeded, a few seconds a run, taking its output
directory as ``--out`` (so COMMAND carries ``{out}``) and writing a small result file
that ``--result-file`` compares with the fault-free run's:

hf_trainer.py       Hugging Face ``Trainer``: a tiny GPT-2 from ``GPT2Config``, ``save_steps``,
                    ``resume_from_checkpoint=True`` when a ``checkpoint-N`` exists; 1 process or
                    real ``torchrun``. Result ``final/model.safetensors``.
lightning_trainer.py  PyTorch Lightning ``Trainer``: ``ModelCheckpoint(save_last=True,
                    every_n_train_steps=...)``, ``fit(ckpt_path="last")``. Result ``final.pt``.
fabric_loop.py      Lightning Fabric: ``fabric.save`` / ``fabric.load`` of a state dict. Result ``final.pt``.
accelerate_loop.py  Hugging Face Accelerate: ``save_state`` / ``load_state`` with
                    ``ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=...)``.
                    Result ``final.safetensors``.
fsdp2_dcp.py        a torchtitan-style FSDP2 (``fully_shard``) loop with DCP ``save`` or
                    ``async_save`` and torchdata's ``StatefulDataLoader`` state saved alongside.
                    Result ``final-rank*.pt``.

Nothing beyond what each framework's docs show, except optional ``chaos.probe`` calls
(marked ``# chaos probe (optional)``), which do nothing outside the harness. The
frameworks are the ``frameworks`` extra (``pip install -e '.[frameworks]'``); the suites
``suites/test_framework_*.py`` put each job under chaos and skip without it.
"""
