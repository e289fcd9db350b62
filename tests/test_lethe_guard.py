"""Lethe's rectification guard: a step that overshoots the stop, explodes or costs retained utility
is shortened or rolled back, and a step that would make the model non-finite is never applied.

The federation is replaced by scripted streams (``ScriptedLethe._streams``): every call returns
the next scripted (forget loss, retained loss) and streams that make each applied step add exactly
1.0 to every weight, so the final state tells which steps were kept, shortened or undone.
"""

import math
from unittest import mock

import pytest
import torch
from flwr.app import ArrayRecord

from strategies.common.base import UnlearnContext
from strategies.common.federation import Federation, RunStopped
from strategies.lethe.maths import OVERSHOOT, rectify_verdict, scale_update
from strategies.lethe.strategy import Lethe
from strategies.run_config import parse_config


def verdict(forget, retain=0.2, reference=0.2, stop=12.0, rise=0.5):
    return rectify_verdict(forget, stop, retain, reference, rise)


def test_verdicts_and_their_precedence():
    assert verdict(1.0) == "go"
    assert verdict(12.0) == "stop" and verdict(OVERSHOOT * 12.0) == "stop"
    assert verdict(OVERSHOOT * 12.0 + 0.1) == "overshoot"
    assert verdict(2e3) == "overshoot"  # the class-scenario explosion of the issue
    assert verdict(1.0, retain=0.71) == "utility" and verdict(1.0, retain=0.69) == "go"
    assert verdict(15.0, retain=2.3) == "utility"  # a dead model at the stop is not a stop
    assert verdict(100.0, retain=2.3) == "overshoot"
    assert verdict(math.nan) == "explode" and verdict(1.0, retain=math.inf) == "explode"
    # no retained report: the utility check cannot be made, the forget checks still are
    assert rectify_verdict(1.0, 12.0, None, None, 0.5) == "go"
    assert rectify_verdict(40.0, 12.0, None, None, 0.5) == "overshoot"
    assert rectify_verdict(40.0, math.inf, None, None, 0.5) == "go"  # guard.stop-loss=inf never overshoots


def test_scale_update_only_shortens():
    update = {"w": torch.ones(3)}
    assert torch.equal(scale_update(update, 0.25)["w"], torch.full((3,), 0.25))
    with pytest.raises(ValueError, match="factor must be in"):
        scale_update(update, 2.0)


class ScriptedLethe(Lethe):
    """Lethe whose streams come from a script of (forget loss, retained loss) per exchange."""

    def __init__(self, script, forget_delta=-1.0, retain_delta=1.0, forget_accs=()):
        super().__init__()
        self.script, self.forget_delta, self.calls, self.configs = list(script), forget_delta, [], []
        self.retain_delta, self.forget_accs = retain_delta, list(forget_accs)

    def _forget_accuracy(self, ctx, state, round_no):
        return self.forget_accs.pop(0) if self.forget_accs else 0.0

    def _streams(self, ctx, state, plugins, *, round_no, stop_loss=None, **config):
        forget_loss, retain_loss, *before = self.script.pop(0)  # before: the retained loss-before, if not the loss
        self.calls.append((round_no, float(state["lin.weight"].flatten()[0])))
        self.configs.append(config)
        def view(delta, loss, node, n, loss_before):  # loss-before: on the received model
            arrays = ArrayRecord({k: v + delta for k, v in state.items()})
            return {"arrays": arrays, "metrics": {"num-examples": n, "loss": loss, "loss-before": loss_before},
                    "node": node}

        # anti-aligned streams: eq. 10 applies -forget on every weight, the clip keeps it at |retain| = 1
        retain_before = before[0] if before else retain_loss
        forget_views = [view(self.forget_delta, forget_loss, 1, 10, forget_loss)]
        retain_views = [view(self.retain_delta, retain_loss, 2, 30, retain_before),
                        view(self.retain_delta, retain_loss, 3, 30, retain_before)]
        return forget_views, retain_views, forget_loss


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)


def rectify(script, rounds=5, forget_delta=-1.0, start=0.0, retain_delta=1.0, forget_accs=(), later_pass=False,
            **overrides):
    # the base bounds (0.5 nats), not the client scenario's own
    cfg = parse_config({"method": "lethe", "recipe": "lethe-robust", "scenario": "client", "lethe.rectify-rounds": rounds,
                        "guard.step-clip": 1.0, "guard.retain-rise": 0.5, **overrides})
    fed = Federation(None, round_timeout=1, min_reply_fraction=0.5)
    fed.start_phase("unlearn")
    ctx = UnlearnContext(fed, cfg, None, model_factory=lambda plugins: Linear(), retrain=None)
    lethe = ScriptedLethe(script, forget_delta, retain_delta, forget_accs)
    lethe.round_offset = 100 if later_pass else 0  # a later pass: its rounds numbered after the first's
    state = {"lin.weight": torch.full((2, 2), start), "lin.bias": torch.full((2,), start)}
    final, history, guard = lethe.rectify_rounds(ctx, state, [])
    guard.pop("checkpoints")  # restore's (the states before each applied step)
    return final["lin.weight"][0, 0].item(), history, guard, lethe, fed.cost("unlearn").rounds


def test_normal_stop_keeps_every_step():
    weight, history, guard, _, rounds = rectify([(1.0, 0.2), (5.0, 0.2), (15.0, 0.2)])
    assert weight == 2.0 and history[-1]["stopped"] is True and guard["action"] == "none"
    assert rounds == 3 and guard["baseline_retain_loss"] == pytest.approx(0.2)


def test_the_start_loss_is_read_on_the_backbone_before_training():
    """Rectification's first round has the retained clients also report their loss of the received
    model with the temporary adapter bypassed (``start_retain_loss``): restore's models are judged by
    that measure. Their training loss in that round, with the adapter on, is the rectify guard's own
    reference (``baseline_retain_loss``)."""
    _, _, guard, lethe, _ = rectify([(1.0, 0.37, 0.01), (5.0, 0.37), (15.0, 0.37)])
    assert guard["baseline_retain_loss"] == pytest.approx(0.37) and guard["start_retain_loss"] == pytest.approx(0.01)
    assert [c.get("report-loss-before") for c in lethe.configs] == ["retain", None, None]


def test_overshoot_shortens_the_last_step_until_it_is_checked_ok():
    # round 3 reports 100 nats (> 3 x 12): round 2's step is halved, the half reports 20 nats -> kept
    weight, history, guard, lethe, rounds = rectify([(1.0, 0.2), (5.0, 0.2), (100.0, 0.2), (20.0, 0.2)])
    assert weight == 1.5
    assert guard == {"round": 2, "verdict": "overshoot", "action": "shrunk", "factor": 0.5, "then": "stop",
                     "forget_loss": 20.0, "retain_loss": pytest.approx(0.2), "baseline_retain_loss": pytest.approx(0.2),
                     "start_retain_loss": pytest.approx(0.2)}
    assert history[-1]["verdict"] == "overshoot" and rounds == 4
    assert lethe.calls[-1][1] == 1.5  # the shortened model is what was checked


def test_overshoot_that_no_halving_fixes_is_rolled_back():
    weight, _, guard, _, rounds = rectify([(1.0, 0.2), (5.0, 0.2), (2e3, 0.2), (900.0, 0.2), (300.0, 0.2),
                                           (80.0, 0.2)])
    assert weight == 1.0 and guard["action"] == "rolled-back" and guard["round"] == 2 and rounds == 6


def test_lost_retained_utility_rolls_the_step_back():
    # retained loss 0.2 on the start, 0.9 after round 2's step (+0.7 > guard.retain-rise 0.5)
    weight, history, guard, _, rounds = rectify([(1.0, 0.2), (5.0, 0.2), (6.0, 0.9)])
    assert weight == 1.0 and guard["action"] == "rolled-back" and guard["verdict"] == "utility"
    assert guard["round"] == 2 and history[-1]["verdict"] == "utility" and rounds == 3
    # the same at the stop round: a model that reached the stop by dying is not accepted
    weight, _, guard, _, _ = rectify([(1.0, 0.2), (5.0, 0.2), (15.0, 2.3)])
    assert weight == 1.0 and guard["verdict"] == "utility"
    # a looser bound accepts it
    weight, _, guard, _, _ = rectify([(1.0, 0.2), (5.0, 0.2), (15.0, 2.3)], **{"guard.retain-rise": 3.0})
    assert weight == 2.0 and guard["action"] == "none"


def test_a_first_step_that_costs_utility_is_halved_not_rolled_back():
    """Rolling back a pass's first step would end the pass where it began, and every verify pass would
    take the same step again. Its half keeps the retained loss in bound here and rectification goes
    on from it to the stop."""
    weight, history, guard, lethe, rounds = rectify([(1.0, 0.2), (2.0, 0.9), (1.5, 0.3), (5.0, 0.2),
                                                     (15.0, 0.2)])
    assert weight == 1.5 and guard["action"] == "none" and history[-1]["stopped"] is True
    assert guard["shrunk_then_on"][0] == {"round": 1, "verdict": "utility", "action": "shrunk", "factor": 0.5,
                                          "then": "go", "forget_loss": 1.5, "retain_loss": pytest.approx(0.3)}
    assert lethe.calls[2] == (2, 0.5) and rounds == 5  # the half is what the next reports judged
    # no half within the bound: the first step is rolled back after all
    weight, _, guard, _, rounds = rectify([(1.0, 0.2), (2.0, 0.9), (1.5, 0.9), (1.2, 0.8), (1.1, 0.75)])
    assert weight == 0.0 and guard["action"] == "rolled-back" and guard["round"] == 1 and rounds == 5


def test_non_finite_report_is_repaired_not_applied():
    # round 2 reports NaN: round 1's step x 0.5 still reports NaN, x 0.25 reports 8 nats -> kept
    weight, _, guard, _, _ = rectify([(1.0, 0.2), (math.nan, 0.2), (math.nan, 0.2), (8.0, 0.2), (12.0, 0.2)])
    assert weight == 0.25 and guard["shrunk_then_on"][0]["verdict"] == "explode"
    assert guard["shrunk_then_on"][0]["factor"] == 0.25


def test_a_shortened_step_short_of_the_stop_lets_rectification_go_on():
    """Four rounds at forget loss 0, then a step to 84 nats whose half gives 0.0003 — stopping there
    forgets nothing. The half is kept and rectification goes on:
    the next round (8 nats on the shortened model) takes one more step, the one after reaches the stop."""
    weight, history, guard, lethe, rounds = rectify([(0.0, 0.2), (0.0, 0.2), (84.0, 0.2), (3e-4, 0.2),
                                                     (3e-4, 0.2), (15.0, 0.2)])
    assert weight == pytest.approx(2.5) and guard["action"] == "none" and history[-1]["stopped"] is True
    assert [r["factor"] for r in guard["shrunk_then_on"]] == [0.5] and guard["shrunk_then_on"][0]["then"] == "go"
    assert [w for _, w in lethe.calls] == [0.0, 1.0, 2.0, 1.5, 1.5, 2.5] and rounds == 6


def test_a_step_that_would_be_non_finite_is_never_applied():
    # unclipped, the step -forget = +2e38 takes a weight of 2e38 past float32's largest value
    weight, history, guard, _, _ = rectify([(1.0, 0.2)], forget_delta=-2e38, start=2e38, **{"guard.step-clip": 0.0})
    assert weight == pytest.approx(2e38) and guard["action"] == "refused" and history[-1]["verdict"] == "explode"


def test_non_finite_streams_on_the_starting_model_stop_clearly():
    with pytest.raises(RunStopped, match="phase 'unlearn' round 1 \\(method 'lethe'\\)"):
        rectify([(math.nan, 0.2)])


def test_round_cap_leaves_the_last_step_for_restore_to_check():
    weight, _, guard, _, rounds = rectify([(1.0, 0.2), (2.0, 0.2)], rounds=2)
    assert weight == 2.0 and rounds == 2
    start, _, _, step_round = guard["unchecked"]
    assert step_round == 2 and start["lin.weight"][0, 0].item() == 1.0


def test_restore_rolls_back_an_unchecked_last_step_that_overshot():
    """The round cap ended rectification: restore's first round reports the forget loss of the last
    step's model; past 3x the stop it is rolled back and the round is run again from the model before."""
    cfg = parse_config({"method": "lethe", "recipe": "lethe-robust", "scenario": "client", "lethe.rectify-rounds": 2,
                        "lethe.restore-rounds": 1, "guard.retain-rise": 0.5})
    fed = Federation(None, round_timeout=1, min_reply_fraction=0.5)
    fed.start_phase("unlearn")
    ctx = UnlearnContext(fed, cfg, None, model_factory=lambda plugins: Linear(), retrain=None)

    def run(script):
        lethe, guard = ScriptedLethe(script), {"action": "none"}
        state = {"lin.weight": torch.full((2, 2), 2.0), "lin.bias": torch.full((2,), 2.0)}
        fallback = {k: torch.ones_like(v) for k, v in state.items()}
        final = lethe.restore_rounds(ctx, state, fallback=fallback, guard=guard)
        return final["lin.weight"][0, 0].item(), guard, lethe.calls

    weight, guard, calls = run([(100.0, 0.2), (5.0, 0.2), (1.0, 0.2)])
    assert weight == 2.0 and guard["action"] == "rolled-back" and guard["round"] == 2
    # checked the last step's model, trained from the one before, then the reports on restore's result
    assert [w for _, w in calls] == [2.0, 1.0, 2.0]
    weight, guard, calls = run([(20.0, 0.2), (1.0, 0.2)])
    assert weight == 3.0 and guard["action"] == "none" and len(calls) == 2


def test_a_restore_round_that_would_be_non_finite_is_not_applied():
    cfg = parse_config({"method": "lethe", "recipe": "lethe-robust", "scenario": "class", "lethe.restore-rounds": 3})
    fed = Federation(None, round_timeout=1, min_reply_fraction=0.5)
    fed.start_phase("unlearn")
    ctx = UnlearnContext(fed, cfg, None, model_factory=lambda plugins: Linear(), retrain=None)

    class Exploding(ScriptedLethe):
        def _streams(self, ctx, state, plugins, **kwargs):
            forget_views, retain_views, loss = super()._streams(ctx, state, plugins, **kwargs)
            if len(self.calls) == 2:  # the second restore round's retain stream overflows float32
                for view in retain_views:
                    view["arrays"] = ArrayRecord({k: v + 3e38 for k, v in state.items()})
            return forget_views, retain_views, loss

    guard = {"action": "none"}
    state = {"lin.weight": torch.full((2, 2), 1e38), "lin.bias": torch.full((2,), 1e38)}
    final = Exploding([(1.0, 0.2)] * 3).restore_rounds(ctx, state, guard=guard)
    assert final["lin.weight"][0, 0].item() == pytest.approx(1e38 + 1.0)  # round 1 applied, round 2 refused
    assert guard["restore_refused_round"] == 2


def test_a_restore_step_that_costs_retained_utility_is_rolled_back():
    """Restore round 3's retained clients report 2.4 nats against 0.2 in round 1: round 2's step
    broke utility, so it is undone and restore stops (the model after round 1 is kept)."""
    cfg = parse_config({"method": "lethe", "recipe": "lethe-robust", "scenario": "class", "lethe.restore-rounds": 4})
    fed = Federation(None, round_timeout=1, min_reply_fraction=0.5)
    fed.start_phase("unlearn")
    ctx = UnlearnContext(fed, cfg, None, model_factory=lambda plugins: Linear(), retrain=None)
    guard = {"action": "none"}
    state = {"lin.weight": torch.zeros(2, 2), "lin.bias": torch.zeros(2)}
    lethe = ScriptedLethe([(1.0, 0.6), (1.0, 0.5), (1.0, 2.4), (1.0, 0.2)])
    final = lethe.restore_rounds(ctx, state, guard=guard)
    assert final["lin.weight"][0, 0].item() == 1.0 and guard["restore_rolled_back_round"] == 2
    assert len(lethe.calls) == 3



def test_a_first_pass_clips_its_step_to_the_retain_stream():
    """The step clip bounds each rectified step by the retain stream: an original that fits the
    retained data (retain stream ~1e-6 per weight) takes vanishing steps in a first pass; an ordinary
    retain stream (|retain| 1) sets the bound."""
    weight, *_ = rectify([(1.0, 0.2), (15.0, 0.2)], retain_delta=1e-6, scenario="sample")
    assert weight == pytest.approx(1e-6, rel=1e-3)
    weight, *_ = rectify([(1.0, 0.2), (15.0, 0.2)])
    assert weight == pytest.approx(1.0)


def test_lifting_a_vanishing_retain_stream_lengthens_the_aligned_step_and_keeps_prop_iv1():
    """Aligned streams, retain ~0: the upper-gamma step has length |retain| tan(theta) and vanishes;
    the lifted stream (0.1 x |forget|) gives the same direction, longer, with both Prop. IV.1 signs."""
    from strategies.lethe.maths import gamma_bounds, layer_gammas, lift_retain
    from strategies.lethe.maths import rectify as rule

    retain, forget = {"w": torch.tensor([1e-6, 5e-7])}, {"w": torch.tensor([3.0, 0.0])}
    lifted, factor = lift_retain(retain, forget, 0.1)
    assert float(lifted["w"].norm()) == pytest.approx(0.3) and factor == pytest.approx(0.3 / float(retain["w"].norm()))

    def step(stream):
        return rule(stream, forget, layer_gammas(gamma_bounds(stream, forget), 0.2, "upper"))["w"]

    short, long = step(retain), step(lifted)
    assert float(short.norm()) < 1e-6 < 0.1 < float(long.norm())
    assert torch.allclose(long, short * factor, rtol=1e-4)
    assert float(long @ forget["w"]) < 0 and abs(float(long @ lifted["w"])) < 1e-6
    # a stream already that long, floor 0, or an all-zero stream stays as it is
    assert lift_retain(forget, retain, 0.1) == (forget, 1.0)
    assert lift_retain(retain, forget, 0.0) == (retain, 1.0)
    zero = {"w": torch.zeros(2)}
    assert lift_retain(zero, forget, 0.1) == (zero, 1.0)


def test_only_a_verify_pass_lifts_the_vanishing_retain_stream():
    """A first pass keeps the vanishing retain stream (``retain_lift`` 1); a verify pass starts from a
    restored model that fits the retained data, so it lifts to VERIFY_LIFT x |forget|; with the
    step-clip guard off nothing is lifted."""
    script = [(1.0, 0.2), (15.0, 0.2)]
    for scenario in ("sample", "client", "class"):
        _, first, *_ = rectify(script, retain_delta=1e-6, scenario=scenario)
        _, later, *_ = rectify(script, retain_delta=1e-6, scenario=scenario, later_pass=True)
        assert first[0]["retain_lift"] == 1.0
        assert later[0]["retain_lift"] == pytest.approx(0.1 * 1.0 / 1e-6, rel=1e-3)
    _, later, *_ = rectify(script, retain_delta=1e-6, later_pass=True, **{"guard.step-clip": 0.0})
    assert later[0]["retain_lift"] == 1.0


def test_the_stop_waits_until_the_forget_set_is_off_its_label():
    """Mean forget loss 15 > 12, yet the backbone still predicts 20 % of the forget set as its label
    (the sample scenario's hidden backdoor): rectification goes on one more step; at 0 % it stops."""
    script = [(1.0, 0.2), (15.0, 0.2), (20.0, 0.2)]
    weight, history, guard, _, rounds = rectify(script, forget_accs=[0.2, 0.0], scenario="sample")
    assert weight == 2.0 and rounds == 3 and history[-1]["stopped"] is True
    assert history[1]["forget_acc"] == 0.2 and history[-1]["forget_acc"] == 0.0
    # the client scenario asks too: its forget set holds no sample of the target class
    weight, history, *_ = rectify(script, forget_accs=[0.2, 0.0])
    assert weight == 2.0 and history[1]["forget_acc"] == 0.2


def test_restore_keeps_the_model_the_retained_clients_rate_best():
    """Three restore rounds; the retained clients' loss of the model they receive is 0.3 on restore's
    start, 0.1 after step 1, 0.2 after step 2 and (one more round of reports, no training) 0.25 after
    step 3: the model after step 2 is kept. Neither the model before any restore step nor the one
    after a single step is a candidate where restore took more (restore makes forgetting last); a
    non-finite report is never chosen."""
    cfg = parse_config({"method": "lethe", "recipe": "lethe-robust", "scenario": "class", "lethe.restore-rounds": 3})
    fed = Federation(None, round_timeout=1, min_reply_fraction=0.5)
    fed.start_phase("unlearn")
    ctx = UnlearnContext(fed, cfg, None, model_factory=lambda plugins: Linear(), retrain=None)
    state = {"lin.weight": torch.zeros(2, 2), "lin.bias": torch.zeros(2)}
    guard = {}
    lethe = ScriptedLethe([(1.0, 0.3), (1.0, 0.1), (1.0, 0.2), (1.0, 0.25)])
    final = lethe.restore_rounds(ctx, state, guard=guard)
    assert final["lin.weight"][0, 0].item() == 2.0 and guard["restore_kept"] == 2
    assert guard["restore_losses"] == pytest.approx([0.3, 0.1, 0.2, 0.25]) and fed.cost("unlearn").rounds == 4
    guard = {}
    lethe = ScriptedLethe([(1.0, 0.5), (1.0, 0.4), (1.0, 0.45), (1.0, math.nan)])
    final = lethe.restore_rounds(ctx, state, guard=guard)
    assert guard["restore_kept"] == 2 and guard["restore_losses"][-1] == math.inf
    guard = {}
    final = ScriptedLethe([(1.0, 0.05), (1.0, 0.3), (1.0, 0.35), (1.0, 0.25)]).restore_rounds(ctx, state, guard=guard)
    assert guard["restore_kept"] == 3 and final["lin.weight"][0, 0].item() == 3.0
    # a restore of one round has one candidate: the model after its step, however low the start's loss
    cfg1 = parse_config({"method": "lethe", "recipe": "lethe-robust", "scenario": "class", "lethe.restore-rounds": 1})
    ctx1 = UnlearnContext(fed, cfg1, None, model_factory=lambda plugins: Linear(), retrain=None)
    guard = {}
    final = ScriptedLethe([(1.0, 0.05), (1.0, 0.3)]).restore_rounds(ctx1, state, guard=guard)
    assert guard["restore_kept"] == 1 and final["lin.weight"][0, 0].item() == 1.0


def test_restore_goes_on_while_no_restored_model_is_near_the_start(monkeypatch):
    """Target 0.02 (the retained clients' loss of the model rectification started from, received and
    untrained, as restore's reports read each model) + a target rise of 0.05 here; their training
    loss with the adapter on (``reference``, 0.5 here) does not move it. Two restore rounds leave 0.6
    and 0.5: extra rounds follow, each judged by the next round's reports and each applying half its
    update (the scripted retain update is +1), until one model is at 0.05 <= 0.07; that model is kept
    and restore stops there. With at most one extra round, 0.3 is the best it reaches (its report
    comes from a round without training)."""
    monkeypatch.setattr("strategies.lethe.restore.RESTORE_TARGET_RISE", 0.05)

    def run(script, extra, target=0.02):
        cfg = parse_config({"method": "lethe", "recipe": "lethe-robust", "scenario": "class", "lethe.restore-rounds": 2,
                            "guard.restore-extra-rounds": extra})
        fed = Federation(None, round_timeout=1, min_reply_fraction=0.5)
        fed.start_phase("unlearn")
        ctx = UnlearnContext(fed, cfg, None, model_factory=lambda plugins: Linear(), retrain=None)
        guard, lethe = {}, ScriptedLethe(script)
        state = {"lin.weight": torch.zeros(2, 2), "lin.bias": torch.zeros(2)}
        final = lethe.restore_rounds(ctx, state, guard=guard, reference=0.5, target_reference=target)
        return final["lin.weight"][0, 0].item(), guard, fed.cost("unlearn").rounds

    weight, guard, rounds = run([(1.0, 0.3), (1.0, 0.6), (1.0, 0.5), (1.0, 0.3), (1.0, 0.05), (1.0, 0.2)], extra=10)
    assert weight == 3.0 and guard["restore_kept"] == 4 and guard["restore_extra_rounds"] == 2 and rounds == 5
    assert guard["restore_losses"] == pytest.approx([0.3, 0.6, 0.5, 0.3, 0.05])
    weight, guard, rounds = run([(1.0, 0.3), (1.0, 0.6), (1.0, 0.5), (1.0, 0.3)], extra=1)
    assert weight == 2.5 and guard["restore_kept"] == 3 and rounds == 4
    # a restore within the target after its own rounds takes no extra round
    weight, guard, rounds = run([(1.0, 0.3), (1.0, 0.6), (1.0, 0.06)], extra=10)
    assert weight == 2.0 and "restore_extra_rounds" not in guard and rounds == 3
    # without a start loss read that way there is no target: no extra round
    weight, guard, rounds = run([(1.0, 0.3), (1.0, 0.6), (1.0, 0.5)], extra=10, target=None)
    assert weight == 2.0 and "restore_extra_rounds" not in guard and rounds == 3
    # the model after a single step is no candidate, so it does not end them either
    weight, guard, rounds = run([(1.0, 0.3), (1.0, 0.06), (1.0, 0.5), (1.0, 0.05), (1.0, 0.2)], extra=10)
    assert weight == 2.5 and guard["restore_kept"] == 3 and guard["restore_extra_rounds"] == 1 and rounds == 4


def restore_with_checkpoints(script, restore_rounds=1, search=0, search_rise=0.05):
    cfg = parse_config({"method": "lethe", "recipe": "lethe-robust", "scenario": "class", "lethe.restore-rounds": restore_rounds,
                        "guard.restore-extra-rounds": 0})
    fed = Federation(None, round_timeout=1, min_reply_fraction=0.5)
    fed.start_phase("unlearn")
    ctx = UnlearnContext(fed, cfg, None, model_factory=lambda plugins: Linear(), retrain=None)
    lethe, guard = ScriptedLethe(script), {"action": "none"}
    def model(value):
        return {"lin.weight": torch.full((2, 2), value), "lin.bias": torch.full((2,), value)}
    with mock.patch.multiple("strategies.lethe.restore", WALK_BACK_SEARCH=search, WALK_BACK_SEARCH_RISE=search_rise):
        final = lethe.restore_rounds(ctx, model(2.0), guard=guard, checkpoints=[model(0.0), model(1.0)], reference=0.02)
    return final["lin.weight"][0, 0].item(), guard, lethe.calls


def test_a_backbone_broken_without_its_adapter_is_walked_back():
    """Rectification judged its steps through the adapter (retained loss 0.02); restore's first round
    finds the adapter-free backbone at 4.4 nats: one rectification step is undone, and
    another while the backbone is still broken (3.0); the one before (0.05) is restored from."""
    weight, guard, calls = restore_with_checkpoints([(1.0, 4.4), (1.0, 3.0), (1.0, 0.05), (1.0, 0.05)])
    assert [w for _, w in calls] == [2.0, 1.0, 0.0, 1.0] and weight == 1.0
    assert guard["backbone_steps_undone"] == [4.4, 3.0] and guard["backbone_retain_loss"] == pytest.approx(0.05)
    # a healthy backbone (0.3 <= 0.02 + 0.5) is restored from as it is
    weight, guard, calls = restore_with_checkpoints([(1.0, 0.3), (1.0, 0.3)])
    assert weight == 3.0 and len(calls) == 2 and "backbone_steps_undone" not in guard


def test_the_walk_back_keeps_the_largest_fraction_of_the_undone_step_that_passes():
    """The walk-back undid the step 1 -> 2 (4.4 nats; the checkpoint 1 gives 0.05 <= 0.02 + 0.5).
    Bisection (3 probes, each one round): x 1/2 (weight 1.5) passes, x 3/4 (1.75) fails, x 5/8 (1.625)
    passes: restore goes on from 1.625 (+1 from its round), and 1 is a checkpoint again for a retry.
    A probe passes at most WALK_BACK_SEARCH_RISE above the checkpoint's 0.05 (and within 0.02 + 0.5)."""
    script = [(1.0, 4.4), (1.0, 0.05), (1.0, 0.3), (1.0, 0.9), (1.0, 0.4), (1.0, 0.4)]
    weight, guard, calls = restore_with_checkpoints(script, search=3, search_rise=0.5)  # bound min(0.52, 0.55)
    assert [w for _, w in calls] == [2.0, 1.0, 1.5, 1.75, 1.625, 2.625]
    assert weight == pytest.approx(2.625) and guard["backbone_fraction"] == 0.625
    assert guard["backbone_search"] == [[0.5, 0.3], [0.75, 0.9], [0.625, 0.4]]
    assert guard["backbone_steps_undone"] == [4.4] and guard["backbone_retain_loss"] == pytest.approx(0.4)
    assert guard["backbone_checkpoint_loss"] == pytest.approx(0.05)
    # the default 0.05 above the checkpoint: 0.3 fails, 0.09 (x 1/4) passes, 0.2 (x 3/8) fails
    weight, guard, calls = restore_with_checkpoints([(1.0, 4.4), (1.0, 0.05), (1.0, 0.3), (1.0, 0.09), (1.0, 0.2),
                                                     (1.0, 0.09)], search=3)
    assert [w for _, w in calls] == [2.0, 1.0, 1.5, 1.25, 1.375, 2.25]
    assert weight == pytest.approx(2.25) and guard["backbone_fraction"] == 0.25
    # no fraction passes: the checkpoint's round (0.05) is what restore goes on from
    weight, guard, calls = restore_with_checkpoints([(1.0, 4.4), (1.0, 0.05), (1.0, 2.0), (1.0, 1.0), (1.0, 0.9),
                                                     (1.0, 0.05)], search=3)
    assert weight == 2.0 and guard["backbone_fraction"] == 0.0 and guard["backbone_retain_loss"] == pytest.approx(0.05)
    assert [w for _, w in calls] == [2.0, 1.0, 1.5, 1.25, 1.125, 2.0]


def test_a_restore_that_diverges_is_run_again_from_one_rectification_step_earlier():
    """Restore from the rectified backbone (weight 2) breaks utility in its second round (2.4 nats against
    0.2): its guard keeps round 0's model; with a retry, restore runs again from the checkpoint before
    the last rectification step (weight 1) and completes both rounds (1 + 2)."""
    def run(retries):
        cfg = parse_config({"method": "lethe", "recipe": "lethe-robust", "scenario": "class", "lethe.restore-rounds": 2,
                            "guard.restore-extra-rounds": 0})
        fed = Federation(None, round_timeout=1, min_reply_fraction=0.5)
        fed.start_phase("unlearn")
        ctx = UnlearnContext(fed, cfg, None, model_factory=lambda plugins: Linear(), retrain=None)
        lethe = ScriptedLethe([(1.0, 0.2), (1.0, 2.4), (1.0, 0.3), (1.0, 0.25), (1.0, 0.2)])
        model = lambda v: {"lin.weight": torch.full((2, 2), v), "lin.bias": torch.full((2,), v)}  # noqa: E731
        guard = {"action": "none", "baseline_retain_loss": 0.02}
        with mock.patch("strategies.lethe.restore.RESTORE_RETRIES", retries):
            final = lethe._restore_with_retries(ctx, model(2.0), None, guard, [model(0.0), model(1.0)])
        return final["lin.weight"][0, 0].item(), guard

    weight, guard = run(0)
    assert weight == 2.0 and guard["restore_rolled_back_round"] == 1
    weight, guard = run(2)
    assert weight == 3.0 and guard["restore_retries"] == [{"restore_rolled_back_round": 1}]
    assert "restore_rolled_back_round" not in guard


def restore_bounded(script, start_loss=0.02):
    """Restore (two rounds, no extra round, no retry) held to the retained clients' ``start_loss`` on
    the original + 0.5 (``guard.retain-rise``)."""
    cfg = parse_config({"method": "lethe", "recipe": "lethe-robust", "scenario": "class", "lethe.restore-rounds": 2,
                        "guard.restore-extra-rounds": 0})
    fed = Federation(None, round_timeout=1, min_reply_fraction=0.5)
    fed.start_phase("unlearn")
    ctx = UnlearnContext(fed, cfg, None, model_factory=lambda plugins: Linear(), retrain=None)
    lethe, guard = ScriptedLethe(script), {"action": "none", "start_retain_loss": start_loss}
    state = {"lin.weight": torch.zeros(2, 2), "lin.bias": torch.zeros(2)}
    with mock.patch("strategies.lethe.restore.RESTORE_RETRIES", 0):
        final = lethe.restore_within_bound(ctx, state, None, guard, [], start_loss)
    return final["lin.weight"][0, 0].item(), guard, lethe.configs, cfg


def test_a_restore_that_broke_utility_is_run_again_at_half_the_lr():
    """Each restore reports 3 times (start, after step 1, after step 2, untrained) and keeps the model
    after step 2. At the run's lr it keeps one the retained clients rate at 0.65 > 0.02 + 0.5; again from the same backbone at
    half the lr (also the LLM task's llm.lr), 0.05: that restore is kept."""
    weight, guard, configs, cfg = restore_bounded([(1.0, 0.2), (1.0, 0.6), (1.0, 0.65),
                                                   (1.0, 0.2), (1.0, 0.1), (1.0, 0.05)])
    assert weight == 2.0 and guard["restore_kept"] == 2 and guard["restore_losses"] == pytest.approx([0.2, 0.1, 0.05])
    assert guard["restore_halvings"] == [{"lr_scale": 1.0, "retain_loss": pytest.approx(0.65), "kept": False},
                                         {"lr_scale": 0.5, "retain_loss": pytest.approx(0.05), "kept": True}]
    assert [c["lr"] for c in configs] == [cfg["lr"]] * 3 + [cfg["lr"] / 2] * 3
    assert [c.get("llm.lr") for c in configs] == [None] * 3 + [cfg["llm.lr"] / 2] * 3
    assert guard["action"] == "none" and guard["start_retain_loss"] == 0.02  # rectification's facts are kept
    # within the bound at the run's lr: one restore, its messages as before the rule
    weight, guard, configs, cfg = restore_bounded([(1.0, 0.2), (1.0, 0.4), (1.0, 0.45)])
    assert "restore_halvings" not in guard and len(configs) == 3 and "llm.lr" not in configs[0]
    # above the bound at every lr: the restore rated best is kept (then Lethe.unlearn judges the pass)
    weight, guard, configs, cfg = restore_bounded([(1.0, 0.2), (1.0, 0.6), (1.0, 0.9), (1.0, 0.2), (1.0, 0.6),
                                                   (1.0, 0.7), (1.0, 0.2), (1.0, 0.6), (1.0, 0.8)])
    assert [h["lr_scale"] for h in guard["restore_halvings"]] == [1.0, 0.5, 0.25]
    assert [h["kept"] for h in guard["restore_halvings"]] == [False, True, False]
    assert guard["restore_losses"][guard["restore_kept"]] == pytest.approx(0.7)
    # no start loss to hold it to (a task whose clients report none): restore runs once, as it was
    weight, guard, configs, cfg = restore_bounded([(1.0, 0.2), (1.0, 0.6), (1.0, 0.9)], start_loss=None)
    assert "restore_halvings" not in guard and len(configs) == 3


class PassScriptedLethe(Lethe):
    """Lethe whose passes and forget-client evaluations are scripted: pass k returns a model whose
    weights are all k, and each check returns the next scripted counts."""

    def __init__(self, counts, guards=()):
        super().__init__()
        self.counts, self.guards, self.starts, self.offsets = list(counts), list(guards), [], []
        self.start_losses = []  # the original's retained loss each pass was given
        self.rises, self.later = [], []  # each pass's walk-back bound in effect and whether it was a verify pass

    def one_pass(self, ctx, start_loss=None):
        self.start_losses.append(start_loss)
        self.rises.append(ctx.cfg["guard.walk-back"])
        self.later.append(self.later_pass)
        self.starts.append(float(ctx.original.arrays.to_torch_state_dict()["lin.weight"][0, 0]))
        self.offsets.append(self.round_offset)
        k = len(self.starts)
        guard = self.guards.pop(0) if self.guards else {}
        return ArrayRecord({"lin.weight": torch.full((2, 2), float(k))}), {"gamma_bounds": [k], "rectify_guard": guard}

    def _forget_counts(self, ctx, state, round_no):
        return self.counts.pop(0)


def verified(counts, scenario="class", guards=(), **overrides):
    """A scripted Lethe's result; the retry of an undone request is off unless ``overrides`` set it."""
    from strategies.common.base import ModelState

    overrides.setdefault("guard.retry-walk-back", 0.0)  # at most guard.walk-back: no retry
    cfg = parse_config({"method": "lethe", "recipe": "lethe-robust", "scenario": scenario, "poison": "backdoor", **overrides})
    ctx = UnlearnContext(None, cfg, ModelState(ArrayRecord({"lin.weight": torch.zeros(2, 2)})),
                         model_factory=lambda plugins: Linear(), retrain=None)
    lethe = PassScriptedLethe(counts, guards)
    result = lethe.unlearn(ctx)
    return float(result.model.arrays.to_torch_state_dict()["lin.weight"][0, 0]), result.details, lethe


def counts(known, n=100):
    """Summed forget-client counts as ``Lethe._forget_counts`` returns them."""
    return {"forget-correct": known, "forget-n": n}


def test_a_restored_model_that_still_knows_the_forget_set_gets_another_pass_from_it():
    # class: 20 % of the forget set still predicted as its label (> VERIFY_FORGET_ACC 0.02)
    weight, details, lethe = verified([counts(20), counts(1)])
    assert weight == 2.0 and details["kept_pass"] == 2 and lethe.starts == [0.0, 1.0]
    assert [c["known"] for c in details["forget_checks"]] == [True, False]
    assert details["gamma_bounds"] == [1] and details["passes"] == [
        {"gamma_bounds": [2], "rectify_guard": {}, "utility": {"retain_loss": None, "bound": None, "broken": False}}]
    assert lethe.offsets[0] == 0 and lethe.offsets[1] > 10 + 5 + 2  # pass 2's rounds (seeds) are its own


@pytest.mark.parametrize("pass2_loss, kept", [(2.33, 1), (0.4, 2)])
def test_a_later_pass_that_broke_utility_is_never_kept(pass2_loss, kept):
    # the retained clients' loss: 0.016 on the original; pass 2's restore keeps a model they rate at
    # pass2_loss; guard.retain-rise 0.5 => bound 0.516
    guards = [{"start_retain_loss": 0.016, "restore_losses": [0.3, 0.04], "restore_kept": 1},
              {"start_retain_loss": 0.014, "restore_losses": [0.25, 3.7, pass2_loss], "restore_kept": 2}]
    weight, details, lethe = verified([counts(86), counts(0)], guards=guards, **{"guard.verify-passes": 2})
    utility = details["passes"][0]["utility"]
    assert utility["retain_loss"] == pass2_loss and utility["bound"] == pytest.approx(0.516)
    assert utility["broken"] is (kept == 1)
    assert weight == float(kept) and details["kept_pass"] == kept
    assert len(lethe.starts) == 2  # a broken pass ends the passes, though more were allowed
    assert len(details["forget_checks"]) == (1 if kept == 1 else 2)
    assert details["kept_still_knows"] is (kept == 1)  # pass 1 still predicts 0.86 of the forget set


def test_a_first_pass_that_broke_utility_is_reported_as_not_carried_out_with_its_own_model(caplog):
    """Pass 1's restore (after its halvings) kept a model rated 2.6 against the original's 0.094
    (bound 0.594): that model, Lethe's own, is reported with the request not carried out; no check or
    further pass runs. Within the bound, pass 1 is kept and its verdict recorded; a later pass is held
    to the original's loss, not to its own start."""
    guards = [{"start_retain_loss": 0.094, "restore_losses": [0.13, 1.1, 2.6], "restore_kept": 2}]
    with caplog.at_level("WARNING", logger="fedunlearn"):
        weight, details, lethe = verified([counts(50)], guards=guards)
    assert weight == 1.0 and details["kept_pass"] == 1 and lethe.counts == [counts(50)]  # never checked
    assert details["utility"] == {"retain_loss": 2.6, "bound": pytest.approx(0.594), "broken": True}
    assert details["carried_out"] is False and "the request is not carried out" in caplog.text
    guards = [{"start_retain_loss": 0.094, "restore_losses": [0.13, 1.1, 0.5], "restore_kept": 2},
              {"start_retain_loss": 0.3, "restore_losses": [0.3, 0.2], "restore_kept": 1}]
    weight, details, lethe = verified([counts(50), counts(0)], guards=guards)
    assert weight == 2.0 and details["utility"]["broken"] is False and lethe.start_losses == [None, 0.094]


def test_a_first_pass_that_forgot_is_kept_and_checked_once():
    weight, details, lethe = verified([counts(2)])  # 0.02: at VERIFY_FORGET_ACC, not above it
    assert weight == 1.0 and details["kept_pass"] == 1 and len(details["forget_checks"]) == 1
    assert details["kept_still_knows"] is False
    assert "passes" not in details and details["carried_out"] is True


def test_when_every_pass_still_knows_the_one_that_knows_least_is_kept(caplog):
    with caplog.at_level("WARNING", logger="fedunlearn"):
        weight, details, _ = verified([counts(20), counts(30)], **{"guard.verify-passes": 1})
    assert weight == 1.0 and details["kept_pass"] == 1 and details["kept_still_knows"] is True
    assert "the kept model (pass 1) still predicts 0.200 of the forget set" in caplog.text
    weight, details, lethe = verified([counts(30), counts(20), counts(25)], **{"guard.verify-passes": 2})
    assert weight == 2.0 and lethe.starts == [0.0, 1.0, 2.0] and len(details["forget_checks"]) == 3


def test_by_default_up_to_three_more_passes_run_and_stop_at_the_first_that_passes():
    """The recipe's ``guard.verify-passes`` (3): a backdoor still known after two more passes gets a
    third, which is kept once its check passes; a model that still knows after the third is not
    passed on to a fourth."""
    weight, details, lethe = verified([counts(74), counts(51), counts(31), counts(1)])
    assert weight == 4.0 and details["kept_pass"] == 4 and len(lethe.starts) == 4
    assert [c["known"] for c in details["forget_checks"]] == [True, True, True, False]
    weight, details, lethe = verified([counts(74), counts(51), counts(31), counts(9), counts(1)])
    assert len(lethe.starts) == 4 and details["kept_pass"] == 4  # no fifth pass; the least known kept


RETRY = {"guard.retry-walk-back": 2.0, "guard.verify-passes": 1}


def test_an_attempt_that_left_the_request_undone_is_retried_from_the_original_with_the_looser_walk_back(caplog):
    """Both passes of the first attempt still know the forget set (0.90, 0.80): one more attempt
    from the original, with guard.walk-back 2; its pass 1 is a first pass (not a verify
    pass), its rounds are its own, and its model, which forgot, is kept."""
    with caplog.at_level("WARNING", logger="fedunlearn"):
        weight, details, lethe = verified([counts(90), counts(80), counts(0)], **RETRY)
    assert weight == 3.0 and lethe.starts == [0.0, 1.0, 0.0]  # the retry starts from the original
    assert lethe.rises == [0.5, 0.5, 2.0] and lethe.later == [False, True, False]
    assert lethe.offsets[2] > lethe.offsets[1] > lethe.offsets[0] == 0
    assert details["kept_still_knows"] is False and details["retry"] == {
        "backbone_rise": 2.0, "kept": True, "other": {"kept_pass": 2, "kept_still_knows": True,
                                                      "utility": details["utility"]}}
    assert "one more attempt from the original with guard.walk-back 2" in caplog.text


def test_where_neither_attempt_carries_the_request_out_the_one_that_knows_less_is_kept():
    weight, details, lethe = verified([counts(90), counts(80), counts(95), counts(85)], **RETRY)
    assert weight == 2.0 and len(lethe.starts) == 4  # the first attempt's model that knows least (0.80)
    assert details["retry"]["kept"] is False and details["retry"]["other"]["kept_still_knows"] is True
    weight, details, lethe = verified([counts(90), counts(80), counts(10), counts(7)], **RETRY)
    assert weight == 4.0 and details["kept_still_knows"] is True  # the retry's 0.07 against 0.80
    assert details["retry"]["kept"] is True and details["retry"]["other"]["kept_pass"] == 2


def test_a_first_pass_that_broke_utility_is_retried_and_the_retry_is_held_to_the_same_bound():
    broken = {"start_retain_loss": 0.094, "restore_losses": [0.13, 1.1, 2.6], "restore_kept": 2}
    fine = {"start_retain_loss": 0.094, "restore_losses": [0.13, 0.3, 0.2], "restore_kept": 2}
    weight, details, lethe = verified([counts(0)], guards=[broken, fine], **RETRY)
    assert weight == 2.0 and details["retry"]["kept"] is True and details["retry"]["other"]["kept_pass"] == 1
    weight, details, lethe = verified([], guards=[broken, broken], **RETRY)
    assert weight == 1.0 and details["kept_pass"] == 1 and details["retry"]["kept"] is False  # its own first model
    assert details["carried_out"] is False


def test_no_retry_where_the_request_was_carried_out_unjudged_or_the_retry_bound_is_not_looser():
    for scripted, overrides in (([counts(1)], RETRY), ([counts(90), counts(80)], {**RETRY,
                                "guard.retry-walk-back": 0.5}), ([None], RETRY)):
        weight, details, lethe = verified(scripted, **overrides)
        assert "retry" not in details and lethe.rises == [0.5] * len(lethe.starts)


def test_the_client_scenario_widens_its_forget_stream_and_the_recipe_gives_it_its_own_bounds():
    """Client scenario, vision task: the forget stream is all the leaving client's data (the paper's
    client-level stream) and the recipe's [scenario.client] bounds apply; in another scenario, or on
    the LLM task (whose client forget set is already all its records), the stream is the forget set."""
    from strategies.lethe.strategy import forget_data

    def bounds(**run):
        cfg = parse_config({"method": "lethe", "recipe": "lethe-robust", **run})
        return (forget_data(cfg), *(cfg[key] for key in ("guard.retain-rise", "guard.walk-back",
                                                          "guard.retry-walk-back")))

    assert bounds(scenario="client") == ({"forget-all-data": True}, 2.0, 2.0, 4.0)
    assert bounds(scenario="client", **{"guard.retain-rise": 1.5}) == ({"forget-all-data": True}, 1.5, 2.0, 4.0)
    assert bounds(scenario="sample") == ({}, 0.5, 0.5, 2.0)
    assert bounds(scenario="client", task="llm-tofu") == ({}, 0.5, 0.5, 2.0)
    assert forget_data(parse_config({"method": "lethe", "scenario": "client"}))


def test_the_client_scenarios_retry_loosens_the_bound_it_runs_under(caplog):
    """The whole-data stream's retry raises the walk-back bound in effect (2.0 -> 3.0)."""
    with caplog.at_level("WARNING", logger="fedunlearn"):
        weight, details, lethe = verified([counts(90), counts(80), counts(0)], scenario="client",
                                          **{**RETRY, "guard.retry-walk-back": 3.0})
    assert lethe.rises == [2.0, 2.0, 3.0] and details["retry"]["kept"] is True
    assert "guard.walk-back 3 (guard.retry-walk-back)" in caplog.text


def test_verify_off_or_unmeasurable_leaves_one_pass():
    weight, details, lethe = verified([counts(90)], **{"guard.verify-passes": 0})
    assert weight == 1.0 and "forget_checks" not in details and lethe.counts  # not even asked
    weight, details, _ = verified([None])  # a task without forget counts (LLM)
    assert weight == 1.0 and "forget_checks" not in details


def test_a_verify_pass_counts_its_stop_from_the_forget_loss_it_starts_at():
    script = [(30.0, 0.2), (35.0, 0.2), (43.0, 0.2)]
    weight, history, guard, *_ = rectify(script)  # first pass: 30 nats is past the 12-nat stop at once
    assert weight == 0.0 and history[0]["stopped"] is True and "stop_loss" not in guard
    weight, history, guard, *_ = rectify(script, later_pass=True)  # stop at 30 + 12, overshoot past 3 x 42
    assert weight == 2.0 and history[-1]["stopped"] is True and guard["stop_loss"] == pytest.approx(42.0)
    # a verify pass rectifies the class down to VERIFY_FORGET_ACC (0.02), not to STOP_FORGET_ACC (0.05)
    weight, *_ = rectify(script + [(45.0, 0.2)], later_pass=True, forget_accs=[0.04, 0.01], scenario="class", rounds=4)
    assert weight == 3.0
