"""Phase 2 of Lethe: dual-stream rectification of the backbone (eq. 7-11), and the guards around it.

:class:`RectifyPhase` is mixed into :class:`strategies.lethe.strategy.Lethe`, whose ``_streams``
runs one round of both streams, ``later_pass`` says whether this is a verify pass, and
``_forget_accuracy`` asks the forget clients what the backbone still predicts. With every ``guard.*``
key at its default this is the paper's phase: T rounds, eq. 10 with a fixed γ, eq. 11.
"""

from __future__ import annotations

import logging
import math

import torch

from strategies.common.base import UnlearnContext
from strategies.common.fedavg_rounds import mean_update
from strategies.common.federation import RunStopped
from strategies.lethe.maths import (check_gamma, clip_to_reference, feasible_gamma_range, gamma_bounds,
                                    layer_gammas, lift_retain, rectify, rectify_verdict, scale_update)
from strategies.common.guards import STOP_FORGET_ACC, VERIFY_FORGET_ACC, VERIFY_LIFT
from strategies.lethe.settings import rectify_lr
from strategies.lethe.views import State, apply_step, mean_loss, retain_losses
from tasks.model import PLUGIN_PREFIX
from tasks.validity import nonfinite_tensors

log = logging.getLogger("fedunlearn")

SHRINK_TRIES = 3  # halvings of an overshooting rectification step before it is rolled back


class RectifyPhase:
    """Lethe's rectification rounds and the rules that stop and guard them."""

    def rectify_rounds(self, ctx: UnlearnContext, state: State, plugins: list[dict]) -> tuple[State, list, dict]:
        """Phase 2: ``lethe.rectify-rounds`` rounds of dual-stream rectification of the backbone.

        Each round: both streams from the composite model (forget clients: eq. 7; retained clients,
        count-weighted: eq. 8), then per named parameter tensor eq. 10 with the γ of
        ``guard.gamma-rule`` and eq. 11. Buffers (BatchNorm statistics) take the retain stream's average.
        Returns the rectified state, the per-round history (stream norms, the Prop. IV.1 bounds per
        layer and whether each γ lies inside them) and the guard's record.

        A step whose result would be non-finite is never applied, and a round whose reports are
        non-finite rolls the step before it back; rectification then stops (the model must stay
        finite to be evaluated). The guards (off by default): ``guard.step-clip`` bounds each step
        and lifts a vanishing retain stream; ``guard.stop-loss`` ends the phase once the backbone's
        forget loss reaches it and the backbone predicts at most ``STOP_FORGET_ACC`` of the forget set
        as its label, and halves (at most ``SHRINK_TRIES`` times) or rolls back a step past 3x it;
        ``guard.retain-rise`` rolls back a step that raised the retained clients' loss by more than it
        (a pass's first step is halved first, since rolling it back ends the pass where it began). A
        shortened step still short of the stop is kept and rectification goes on from it
        (``guard["shrunk_then_on"]``). ``guard["unchecked"]`` holds the last step when the round cap
        ended the phase before any report judged it (the rectified restore checks it)."""
        cfg, fed = ctx.cfg, ctx.fed
        param_names = [n for n, _ in ctx.model_factory(plugins).named_parameters()
                       if not n.startswith(PLUGIN_PREFIX)]
        buffer_names = [k for k in state if k not in param_names and not k.startswith(PLUGIN_PREFIX)]
        gamma, history = cfg["lethe.gamma"], []
        step_clip = cfg["guard.step-clip"]
        # a verify pass starts from a model restore has just fit to the retained data: with the step
        # clip on, its vanishing retain stream is lifted so that the clipped steps do not vanish with it
        lift_floor = VERIFY_LIFT if step_clip > 0 and self.later_pass else 0.0
        local = {"scope": "base", "lr": rectify_lr(cfg), "epochs": cfg["lethe.epochs"]}
        judge = _Judge(cfg["guard.stop-loss"], cfg["guard.retain-rise"], relative=self.later_pass)
        guard: dict = {"action": "none"}
        previous = None  # (state before the last applied step, the step, its retain views, its round)
        checkpoints: list[State] = []  # the state before every applied step, oldest first
        start_loss = None  # the retained clients' loss of the starting backbone (round 1's loss-before)
        for t in range(1, cfg["lethe.rectify-rounds"] + 1):
            ask_start = {"report-loss-before": "retain"} if t == 1 else {}
            forget_views, retain_views, forget_loss = self._streams(ctx, state, plugins, round_no=t,
                                                                    stop_loss=cfg["guard.stop-loss"], **local,
                                                                    **ask_start)
            fed.cost(fed.phase).rounds += 1
            if t == 1 and all("loss-before" in v["metrics"] for v in retain_views):
                start_loss = mean_loss(retain_views, "loss-before")
            verdict, retain_loss = judge(forget_loss, retain_views, first=t == 1)
            entry = {"forget_loss": forget_loss, "retain_loss": retain_loss}
            forget = mean_update(forget_views, state, param_names)
            retain = mean_update(retain_views, state, param_names)
            norms = {name: float(torch.sqrt(sum((v.double() ** 2).sum() for v in stream.values())))
                     for name, stream in (("retain", retain), ("forget", forget))}
            if verdict == "go" and not all(math.isfinite(v) for v in norms.values()):
                verdict = "explode"
            if verdict in ("explode", "overshoot", "utility") and previous is not None:
                history.append({**entry, "verdict": verdict})
                state, record = self._repair(ctx, plugins, previous, verdict, judge, t, buffer_names, local)
                if record.get("then") == "go":  # the shortened step is still short of the stop: rectify on
                    guard.setdefault("shrunk_then_on", []).append(record)
                    start, step, views, step_round = previous
                    previous = (start, scale_update(step, record["factor"]), views, step_round)
                    continue
                guard = {**record, **{k: guard[k] for k in ("shrunk_then_on",) if k in guard}}
                break
            if verdict == "explode":
                raise RunStopped(f"phase 'unlearn' round {t} (method 'lethe'): a Lethe update stream or loss is "
                                 f"non-finite on the starting model (norms {norms}); lower lethe.lr")
            if verdict == "stop" and not self._forgotten(ctx, state, t, entry):
                verdict = "go"
            if verdict != "go":
                log.info("[lethe] rectify round %d: the backbone's forget loss %.3g against the stop %g: "
                         "rectification stops", t, forget_loss, judge.stop_loss)
                history.append({**entry, "stopped": True})
                break
            retain, lift = lift_retain(retain, forget, lift_floor)
            bounds = gamma_bounds(retain, forget)
            gammas = layer_gammas(bounds, gamma, cfg["guard.gamma-rule"])
            inside = check_gamma(bounds, gammas)
            update = clip_to_reference(rectify(retain, forget, gammas), retain, step_clip)
            candidate = apply_step(state, update, retain_views, buffer_names)
            if nonfinite_tensors(candidate):
                log.warning("[lethe] rectify round %d: the step would make the model non-finite: not applied, "
                            "rectification stops", t)
                history.append({**entry, "verdict": "explode"})
                guard = {"action": "refused", "round": t, "reason": "the step would make the model non-finite"}
                break
            checkpoints.append(state)
            previous, state = (state, update, retain_views, t), candidate
            aligned = [k for k, b in bounds.items() if b is not None]
            log.info("[lethe] rectify round %d/%d: |retain| %.3g (lifted x %.3g) |forget| %.3g; forget loss %.3g, "
                     "retained loss %s; %d/%d layers aligned (s>0), gamma (%s) inside the Prop. IV.1 bounds on %d "
                     "of them",
                     t, cfg["lethe.rectify-rounds"], norms["retain"], lift, norms["forget"], forget_loss,
                     "n/a" if retain_loss is None else f"{retain_loss:.3g}", len(aligned), len(bounds),
                     cfg["guard.gamma-rule"], sum(inside[k] for k in aligned))
            feasible = feasible_gamma_range(bounds)
            history.append({**entry, "retain_norm": norms["retain"], "forget_norm": norms["forget"],
                            "retain_lift": lift, "feasible_gamma": list(feasible) if feasible else None,
                            "layers": {k: {"lower": b[0], "upper": b[1], "gamma": gammas[k],
                                           "gamma_inside": inside[k]}
                                       for k, b in bounds.items() if b is not None}})
        else:
            if previous is not None:  # the round cap ended the phase: no report has judged the last step
                guard["unchecked"] = previous
        guard["baseline_retain_loss"] = judge.reference_loss
        guard["start_retain_loss"] = start_loss
        if judge.relative:
            guard["stop_loss"] = judge.stop_loss  # this pass's stop: guard.stop-loss above its start
        guard["checkpoints"] = [c for c in checkpoints if c is not state]
        return state, history, guard

    def _forgotten(self, ctx: UnlearnContext, state: State, round_no: int, entry: dict) -> bool:
        """The loss stop's second condition: the backbone (adapter bypassed) predicts at most
        ``STOP_FORGET_ACC`` of the forget set as its label (``VERIFY_FORGET_ACC`` in a verify pass);
        a mean forget loss can hide a part of the forget set still known. One ``evaluate`` message
        to each forget client."""
        limit = VERIFY_FORGET_ACC if self.later_pass else STOP_FORGET_ACC
        acc = entry["forget_acc"] = self._forget_accuracy(ctx, state, round_no)
        if acc > limit:
            log.info("[lethe] rectify round %d: forget loss at the stop, but the backbone still predicts %.3f of "
                     "the forget set as its label (> %g): rectification goes on", round_no, acc, limit)
        return acc <= limit

    def _repair(self, ctx: UnlearnContext, plugins: list[dict], previous, verdict: str, judge: "_Judge",
                round_no: int, buffer_names: list[str], local: dict) -> tuple[State, dict]:
        """The step of ``previous`` broke something (``verdict``): with a guard on, shorten it
        (overshoot, explode, or utility in the pass's first round) or roll it back (utility later on,
        or when no shortened step passes); with none on (the paper), roll it back. Returns the state
        and the record. A later step that costs utility is rolled back, keeping what the rounds
        before it forgot; the first step has nothing before it, so it is shortened instead."""
        fed, cfg = ctx.fed, ctx.cfg
        start, step, retain_views, step_round = previous
        record = {"round": step_round, "verdict": verdict}
        if judge.guarded and (verdict != "utility" or step_round == 1):
            for k in range(1, SHRINK_TRIES + 1):
                factor = 0.5 ** k
                candidate = apply_step(start, scale_update(step, factor), retain_views, buffer_names)
                if nonfinite_tensors(candidate):
                    continue
                _, views, forget_loss = self._streams(ctx, candidate, plugins, round_no=round_no,
                                                      stop_loss=cfg["guard.stop-loss"], **local)
                fed.cost(fed.phase).rounds += 1
                again, retain_loss = judge(forget_loss, views)
                log.info("[lethe] guard: round %d's step x %g gives forget loss %.3g, retained loss %s: %s",
                         step_round, factor, forget_loss, "n/a" if retain_loss is None else f"{retain_loss:.3g}",
                         again)
                if again in ("go", "stop"):
                    log.warning("[lethe] guard: round %d's step (%s) shortened to x %g; rectification %s",
                                step_round, verdict, factor, "goes on" if again == "go" else "stops")
                    return candidate, {**record, "action": "shrunk", "factor": factor, "then": again,
                                       "forget_loss": forget_loss, "retain_loss": retain_loss}
        log.warning("[lethe] guard: round %d's step (%s) rolled back; rectification stops", step_round, verdict)
        return start, {**record, "action": "rolled-back"}


class _Judge:
    """``rectify_verdict`` with the retained clients' reference: their losses in the first round,
    i.e. on the model rectification started from, kept per node so that a round in which some
    client did not reply is compared with the same clients' reference. ``relative`` (a verify
    pass): the stop, and with it the overshoot bound, counts from the first round's forget loss,
    since a model that already forgot most of the forget set starts past the absolute stop."""

    def __init__(self, stop_loss: float, max_rise: float, *, relative: bool = False):
        self.stop_loss, self.max_rise, self.relative = stop_loss, max_rise, relative
        self.guarded = math.isfinite(stop_loss) or math.isfinite(max_rise)  # a guard judges the steps
        self.baseline: dict[int, float] = {}
        self.reference_loss: float | None = None

    def __call__(self, forget_loss: float, retain_views, *, first: bool = False) -> tuple[str, float | None]:
        """``(verdict, retained loss)`` of one round's reports."""
        if first:
            self.baseline = {v["node"]: float(v["metrics"]["loss"]) for v in retain_views}
            if self.relative and math.isfinite(forget_loss):
                self.stop_loss += forget_loss
        now, then = retain_losses(retain_views, self.baseline)
        if first:
            self.reference_loss = then
        return rectify_verdict(forget_loss, self.stop_loss, now, then, self.max_rise), now

