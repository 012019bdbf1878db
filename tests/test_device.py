"""``--device cuda``: the CPU-side logic, tested here; what needs a GPU is marked ``gpu`` and skips.

Here (no GPU): the workload key and its validation, which runs are judged bit-exact,
the ConfigError before any rank starts (for real: this machine has no CUDA), the flag in
the replay command, each rank's CUDA_VISIBLE_DEVICES from the supervisor, the golden
key, a rank that refuses device=cuda on its own, and the ``gpu`` marker's skip. The
counting of GPUs against ranks uses a stand-in for ``torch.cuda`` (a pure unit test).
"""

from __future__ import annotations

import shlex
import textwrap

import pytest
import torch

from chaos.cli.main import build_scenarios, main, make_parser
from chaos.errors import ConfigError
from chaos.launch import cluster
from chaos.nemesis.environment import Environment
from chaos.plan.scenario import Scenario, parse_fault
from chaos.record import golden
from chaos.record.history import RunRecord
from chaos.target.workload import device
from chaos.target.workload.config import WorkloadConfig

pytest_plugins = ["pytester"]
HAS_CUDA = torch.cuda.is_available()
no_gpu_here = pytest.mark.skipif(HAS_CUDA, reason="this machine has a CUDA device: the no-GPU path cannot be seen")


# -- the workload key -----------------------------------------------------------------

def test_the_device_is_a_workload_key_left_out_of_the_key_at_its_default():
    cpu = WorkloadConfig()
    assert cpu.device == "cpu" and not cpu.deterministic
    assert not {"device", "deterministic", "corpus"} & set(cpu.to_dict())  # existing golden keys stay
    cuda = WorkloadConfig(device="cuda", deterministic=True)
    assert cuda.to_dict()["device"] == "cuda" and cuda.to_dict()["deterministic"] is True
    assert WorkloadConfig.from_dict(cuda.to_dict()) == cuda


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"device": "tpu"}, "device='tpu' is unknown: choose one of cpu, cuda"),
    ({"device": "cuda", "deterministic": 1}, "deterministic=1 must be true or false"),
])
def test_bad_device_settings_are_config_errors(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        WorkloadConfig(**kwargs)


@pytest.mark.parametrize(("kwargs", "tolerance"), [
    ({}, False),                                        # cpu: bit-exact
    ({"nondeterminism": 0.01}, True),                   # cpu with simulated noise
    ({"device": "cuda"}, True),                         # cuda: tolerance mode by default
    ({"device": "cuda", "deterministic": True}, False),  # cuda asked to be bit-exact
    ({"device": "cuda", "deterministic": True, "nondeterminism": 0.01}, True),
])
def test_which_runs_are_judged_bit_exact(kwargs, tolerance):
    assert WorkloadConfig(**kwargs).nondeterministic is tolerance


# -- before any rank starts -----------------------------------------------------------

@no_gpu_here
def test_without_cuda_the_reason_says_so():
    why = device.unavailable(1)
    assert why.startswith("no CUDA device: torch.cuda.is_available() is false")
    assert torch.__version__ in why


@no_gpu_here
def test_a_cuda_scenario_fails_validation_here():
    scenario = Scenario("reference", world_size=2, workload=WorkloadConfig(device="cuda"))
    with pytest.raises(ConfigError, match="--device cuda: no CUDA device"):
        scenario.validate()
    Scenario("reference", world_size=2).validate()  # cpu asks nothing of the machine


class _FakeCuda:
    """Stands in for ``torch.cuda``'s two answers ``device.unavailable`` reads."""

    def __init__(self, count: int) -> None:
        self.count = count

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count


def test_fewer_gpus_than_ranks_is_a_config_error_naming_both(monkeypatch):
    monkeypatch.setattr(torch, "cuda", _FakeCuda(1))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(ConfigError, match=r"--device cuda: 2 ranks need 2 CUDA devices \(one each\), but 1 visible "
                                          r"\(CUDA_VISIBLE_DEVICES='3'\)"):
        device.check("cuda", 2)
    device.check("cuda", 1)
    device.check("cpu", 8)


@no_gpu_here
def test_chaos_run_device_cuda_stops_with_one_line_before_any_rank(tmp_path, capsys):
    scratch, cache = tmp_path / "scratch", tmp_path / "cache"
    rc = main(["run", "--device", "cuda", "--fault", "kill:rank=1,step=3", "--steps", "6",
               "--scratch", str(scratch), "--cache-dir", str(cache), "--json", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "chaos: error: --device cuda: no CUDA device: torch.cuda.is_available() is false" in err
    assert "Traceback" not in err
    assert not scratch.exists() and not cache.exists()  # no golden run, no scenario root: no rank started


def test_device_flag_and_workload_key_must_agree(capsys):
    rc = main(["run", "--device", "cuda", "--workload", "device=cpu", "--fault", "kill:rank=1,step=3"])
    assert rc == 2
    assert "--device cuda contradicts --workload device=cpu" in capsys.readouterr().err


def test_cuda_with_the_docker_driver_is_refused():
    scenario = Scenario("reference", workload=WorkloadConfig(device="cuda"), driver="docker")
    with pytest.raises(ConfigError, match="--device cuda needs --driver process"):
        scenario.validate()


# -- replay ---------------------------------------------------------------------------

def test_the_replay_command_carries_the_device_and_rebuilds_the_scenario():
    args = make_parser().parse_args(["run", "--device", "cuda", "--workload", "deterministic=true",
                                     "--fault", "kill:rank=1,step=9", "--steps", "12"])
    (scenario,) = build_scenarios(args)
    assert scenario.workload.device == "cuda" and scenario.workload.deterministic is True
    assert scenario.id.endswith("-cuda")
    replay = scenario.replay_command()
    assert "--device cuda" in replay and "--workload deterministic=true" in replay
    assert "device=cuda" not in replay  # said once, as the flag
    (again,) = build_scenarios(make_parser().parse_args(shlex.split(replay)[1:]))
    assert again.to_dict() == scenario.to_dict()
    assert Scenario.from_dict(scenario.to_dict()).workload == scenario.workload
    cpu = Scenario("reference", faults=[parse_fault("kill:rank=1,step=9")])
    assert "--device" not in cpu.replay_command()


# -- the supervisor gives each rank its one GPU ---------------------------------------

def test_each_rank_sees_one_gpu(monkeypatch):
    cuda = {"device": "cuda"}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [device.rank_env(cuda, r) for r in range(2)] == [{"CUDA_VISIBLE_DEVICES": "0"},
                                                            {"CUDA_VISIBLE_DEVICES": "1"}]
    assert device.rank_env({}, 1) == {} and device.rank_env({"device": "cpu"}, 1) == {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 6")  # the runner handed the job GPUs 4 and 6
    assert device.rank_env(cuda, 1) == {"CUDA_VISIBLE_DEVICES": "6"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")
    assert device.rank_env(cuda, 0) == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}
    with pytest.raises(ConfigError, match="rank 2 has no GPU"):
        device.rank_env(cuda, 2)


def test_the_rank_spec_carries_its_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def spec(workload: WorkloadConfig, rank: int):
        plan = cluster.LaunchPlan(world_size=2, workload=workload.to_dict(), log_dir=str(tmp_path / "logs"))
        attempt = cluster.Attempt(plan, 0, Environment([], 2, None, plan.log_dir, 0))
        return attempt._spec(rank, 29500)

    assert spec(WorkloadConfig(device="cuda"), 1).env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in spec(WorkloadConfig(), 1).env


def test_the_training_group_is_nccl_for_cuda_tensors_and_gloo_for_cpu_ones():
    assert device.backend("cuda", "gloo") == "cpu:gloo,cuda:nccl"
    assert device.backend("cpu", "gloo") == "gloo"


# -- golden key -----------------------------------------------------------------------

def test_the_golden_key_includes_the_device():
    cpu, cuda = WorkloadConfig(), WorkloadConfig(device="cuda")
    assert golden.golden_key(cpu, 2, "gloo") != golden.golden_key(cuda, 2, "gloo")
    assert golden.golden_key(cuda, 2, "gloo") != golden.golden_key(
        WorkloadConfig(device="cuda", deterministic=True), 2, "gloo")
    assert device.golden_facts("cpu", 2) == {}  # CPU keys are what they were
    facts = device.golden_facts("cuda", 2)
    assert facts["device"] == "cuda" and facts["process_group"] == "cpu:gloo,cuda:nccl"
    assert facts["cuda"] == torch.version.cuda
    assert ("gpus" in facts) is HAS_CUDA


def test_other_gpus_make_another_golden_key(monkeypatch):
    cuda = WorkloadConfig(device="cuda")
    monkeypatch.setattr(device, "golden_facts", lambda d, n: {"device": d, "gpus": ["NVIDIA H100"] * n})
    h100 = golden.golden_key(cuda, 2, "gloo")
    monkeypatch.setattr(device, "golden_facts", lambda d, n: {"device": d, "gpus": ["NVIDIA A10"] * n})
    assert golden.golden_key(cuda, 2, "gloo") != h100


# -- the rank's own guard -------------------------------------------------------------

@no_gpu_here
def test_a_rank_asked_for_cuda_without_a_gpu_exits_with_a_config_error(tmp_path):
    """What the rank does when a launcher skipped the harness's check: a typed refusal."""
    log_dir = tmp_path / "logs"
    plan = cluster.LaunchPlan(world_size=1, workload=WorkloadConfig(steps=2, device="cuda").to_dict(),
                              log_dir=str(log_dir), scratch=str(tmp_path))
    cluster.warm_up()
    result = cluster.run(plan)
    assert result.attempts[-1].outcome == "config_error"
    errors = RunRecord.collect(result, str(log_dir), 1).errors()
    assert errors and errors[0]["kind"] == "config"
    assert "workload device=cuda: this rank sees no CUDA device" in errors[0]["message"]


# -- the gpu marker -------------------------------------------------------------------

@no_gpu_here
def test_gpu_tests_skip_with_the_reason_before_their_fixtures(pytester):
    pytester.makepyfile(test_needs_gpu=textwrap.dedent("""
        import pytest

        @pytest.fixture
        def boom():
            raise AssertionError("a gpu test's fixture ran")

        @pytest.mark.gpu
        def test_one(boom):
            raise AssertionError("ran")

        @pytest.mark.gpu(count=2)
        def test_two(chaos):
            raise AssertionError("ran")

        def test_cpu():
            pass
    """))
    run = pytester.inline_run("-p", "no:cacheprovider", "-o", "addopts=")
    run.assertoutcome(passed=1, skipped=2)
    _, skipped, _ = run.listoutcomes()
    reasons = {r.nodeid.split("::")[-1]: r.longrepr[2] for r in skipped}
    assert sorted(reasons) == ["test_one", "test_two"]
    assert all(why.startswith("Skipped: no CUDA device: torch.cuda.is_available() is false")
               for why in reasons.values()), reasons


# -- on a GPU -------------------------------------------------------------------------

@pytest.mark.gpu
def test_cuda_rng_state_is_captured_and_restored_on_the_device():
    from chaos.target.workload import rng

    torch.cuda.set_device(0)
    state = rng.capture("cuda")
    assert state["cuda"].device.type == "cpu" and state["cuda"].dtype == torch.uint8
    first = torch.rand(8, device="cuda")
    rng.restore(state)
    assert torch.equal(torch.rand(8, device="cuda"), first)
    assert "cuda" not in rng.capture("cpu")  # a cpu rank never touches CUDA's generators
