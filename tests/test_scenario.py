import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaos.cli.main import build_scenarios, make_parser
from chaos.errors import ConfigError
from chaos.model.keyvalue import _parse_value, format_value
from chaos.plan.scenario import Fault, Scenario, parse_fault
from chaos.target.workload.config import WorkloadConfig


def test_parse_fault_roundtrips_through_spec():
    f = parse_fault("term:rank=1,step=7,grace=2")
    assert f == Fault("term", 1, 7, 0, (("grace", 2),))
    assert parse_fault(f.spec()) == f
    assert Fault.from_dict(f.to_dict()) == f


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("boom:rank=1,step=2", "unknown fault kind 'boom'"),
        ("kill:rank=1", "needs step"),
        ("kill:step=3", "needs rank"),
        ("kill:rank=1,step", "expected key=value"),
        ("kill:rank=1,step=2,rank=0", "given twice"),
        ("kill:rank=-1,step=2", "non-negative"),
        ("kill:rank=1,step=2,grace=3", "not 'grace'"),
    ],
)
def test_malformed_faults_are_rejected_with_the_text(text, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        parse_fault(text)
    assert text in str(err.value)


def test_scenario_validation_names_the_fault():
    s = Scenario("dcp", world_size=2, faults=[parse_fault("kill:rank=5,step=3")])
    with pytest.raises(ConfigError, match="rank 5 does not exist"):
        s.validate()
    s = Scenario("dcp", world_size=2, workload=WorkloadConfig(steps=10), faults=[parse_fault("kill:rank=0,step=30")])
    with pytest.raises(ConfigError, match=r"step must be in 1\.\.10"):
        s.validate()


def test_replay_command_rebuilds_the_same_scenario():
    args = make_parser().parse_args([
        "run", "--checkpointer", "dcp", "--steps", "12", "--save-every", "4", "--seed", "3",
        "--fault", "kill:rank=1,step=9", "--workload", "d_model=64", "--ckpt-opt", "per_rank_keys=rng",
    ])
    (scenario,) = build_scenarios(args)
    replay = scenario.replay_command().split()
    assert replay[:2] == ["chaos", "run"]
    (again,) = build_scenarios(make_parser().parse_args(replay[1:]))
    assert again.to_dict() == scenario.to_dict()
    assert Scenario.from_dict(scenario.to_dict()).to_dict() == scenario.to_dict()


def test_replay_keeps_floats_in_exponent_form_and_booleans_as_values():
    import shlex

    scenario = Scenario(checkpointer="reference", workload=WorkloadConfig(nondeterminism=1e-05),
                        faults=[parse_fault("kill:rank=1,step=9")], ckpt_options={"async_save": True},
                        loss_band=2.5e-3)
    (again,) = build_scenarios(make_parser().parse_args(shlex.split(scenario.replay_command())[1:]))
    assert again.workload.nondeterminism == 1e-05 and isinstance(again.workload.nondeterminism, float)
    assert again.ckpt_options == {"async_save": True} and again.loss_band == 2.5e-3


@given(st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.booleans()))
def test_values_round_trip_through_their_text(value):
    assert _parse_value(format_value(value)) == value
    assert type(_parse_value(format_value(value))) is type(value)


def test_default_campaign_covers_every_family_once():
    scenarios = build_scenarios(make_parser().parse_args(["run"]))
    families = [s.faults[0].family for s in scenarios]
    assert sorted(families) == sorted(["process", "process", "io", "process", "rest", "rest", "disk", "net",
                                       "powerloss"])
    linger = next(s.faults[0] for s in scenarios if s.faults[0].param("linger", None))
    assert linger.kind == "kill" and linger.param("phase", None) == "save"
    assert {s.faults[0].kind for s in scenarios if s.faults[0].family == "rest"} == {"bitflip", "payload"}
    kill = scenarios[0].faults[0]
    assert kill.kind == "kill" and kill.rank == 1 and kill.step % scenarios[0].workload.save_every != 0
    assert all(s.checkpointer == "reference" for s in scenarios)
    for s in scenarios:
        s.validate()
    net = next(s for s in scenarios if s.faults[0].family == "net")
    assert net.workload.collective_timeout_s == 5.0


def test_unfired_io_fault_blames_c_level_writers_only_when_nothing_was_traced():
    from chaos.plan.scenario import Scenario, parse_fault
    from chaos.record.history import RunRecord
    from chaos.run.runner import _unfired_io_faults

    sc = Scenario("reference", faults=[parse_fault("eio:rank=1,step=5,op=rename")])
    reached = RunRecord(2, [], io={"ops": {"write": 4, "fsync": 4}, "fired": [], "untraced_files": []})
    why = _unfired_io_faults(sc, reached)
    assert "no traced I/O operation matched its point (traced: fsync=4, write=4)" in why and "C-level" not in why
    c_level = RunRecord(2, [], io={"ops": {}, "fired": [], "untraced_files": ["step-5/model.pt"]})
    assert "not traced (written by C-level code: step-5/model.pt)" in _unfired_io_faults(sc, c_level)
    fired = RunRecord(2, [], io={"ops": {"rename": 1}, "fired": [{"rule": 0, "rank": 1, "attempt": 0}],
                                 "untraced_files": []})
    assert _unfired_io_faults(sc, fired) is None


def test_a_parallelism_that_cannot_run_on_the_world_size_is_refused_before_any_launch():
    from chaos.errors import ConfigError
    from chaos.plan.scenario import Scenario, parse_fault
    from chaos.target.workload.config import WorkloadConfig

    with pytest.raises(ConfigError, match="parallel=hsdp needs an even world size"):
        Scenario("reference", world_size=3, workload=WorkloadConfig(parallel="hsdp")).validate()
    shrink = Scenario("reference", world_size=4, workload=WorkloadConfig(parallel="hsdp"),
                      faults=[parse_fault("kill:rank=1,step=5,lost=true")])
    with pytest.raises(ConfigError, match="got 3"):  # the resized world of the restart, not only the first
        shrink.validate()
    Scenario("reference", world_size=4, workload=WorkloadConfig(parallel="hsdp")).validate()
