"""Phase 3 of Lethe, with ``guard.rectified-restore``: restore the utility of the rectified,
adapter-free backbone without re-learning the forget data (ours).

:class:`RestorePhase` is mixed into :class:`strategies.lethe.strategy.Lethe`, whose ``_streams``
runs one round of both streams. The paper's restore (R rounds of FedAvg on the retained clients) is
run by ``Lethe.one_pass`` itself.
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

from strategies.common.base import UnlearnContext
from strategies.common.fedavg_rounds import mean_update
from strategies.lethe.maths import layer_alignment, rectify_verdict, remove_forget_component, scale_update
from strategies.common.guards import RESTORE_RETRIES, RESTORE_TARGET_RISE, WALK_BACK_SEARCH, WALK_BACK_SEARCH_RISE
from strategies.lethe.views import State, apply_step, losses_before, mean_loss, retain_losses
from tasks.validity import nonfinite_tensors

log = logging.getLogger("fedunlearn")

EXTRA_STEP = 0.5  # the share of its update an extra restore round applies (restore_rounds says why)
MIN_RESTORE_STEPS = 2  # restore keeps a model after at least this many of its steps, where it took as many
RESTORE_FAILED = ("restore_rolled_back_round", "restore_refused_round")
RESTORE_HALVINGS = 2  # times a restore that broke utility is run again at half the lr (restore_within_bound)


class _Attempt(NamedTuple):
    """One restore of :meth:`RestorePhase.restore_within_bound`."""

    lr_scale: float
    utility: dict  # pass_utility's verdict on the model it kept
    guard: dict
    model: State


class RestorePhase:
    """Lethe's rectified restore, its guards and its retries."""

    def restore_rounds(self, ctx: UnlearnContext, state: State, *, fallback: State | None = None,
                       guard: dict | None = None, checkpoints: list[State] | None = None,
                       reference: float | None = None, target_reference: float | None = None,
                       lr_scale: float = 1.0) -> State:
        """Phase 3 with ``guard.rectified-restore``: ``lethe.restore-rounds`` rounds in which the
        retained clients train the adapter-free model as in FedAvg (the run's ``lr`` times ``lr_scale``,
        ``local-epochs``) and the forget clients do the same on their forget data; the server applies the
        retain stream with its component along the forget stream removed wherever they align
        (``remove_forget_component``), so utility comes back without re-learning the forget data.

        ``fallback``: the model before rectification's last step when no report judged that step. The
        first restore round's forget clients then report their forget loss of the received model; if it
        is non-finite or past 3x ``guard.stop-loss`` the step is rolled back and the round runs again from
        ``fallback``. A restore round whose result would be non-finite is not applied and ends restore
        (``guard["restore_refused_round"]``). A round whose retained clients report a loss more than
        ``guard.retain-rise`` above their report of the first restore round rolls the previous restore
        step back and ends restore (``guard["restore_rolled_back_round"]``).

        The walk-back (``guard.walk-back``): rectification judged its steps through the adapter, and the
        first restore round is the first report on the backbone alone. While its retained loss is more
        than ``guard.walk-back`` above ``reference`` (the retained clients' loss in rectification's first
        round), restore goes back one rectification step (``checkpoints``, oldest first;
        ``guard["backbone_steps_undone"]``), at worst to the original; then the largest passing fraction
        of the step undone last is taken back (:meth:`_backbone_search`).

        Extra rounds (``guard.restore-extra-rounds``): while no model that :func:`_best_restored` may keep
        has a retained loss within ``RESTORE_TARGET_RISE`` of ``target_reference`` (the same clients' loss of
        the model rectification started from, read the same way), more rounds follow, each applying
        ``EXTRA_STEP`` of its update; the first model within the target ends restore."""
        cfg, fed = ctx.cfg, ctx.fed
        retain_rise = cfg["guard.retain-rise"]
        backbone_rise = cfg["guard.walk-back"]
        guard = {} if guard is None else guard
        param_names = [n for n, _ in ctx.model_factory([]).named_parameters()]
        buffer_names = [k for k in state if k not in param_names]
        local = {"scope": "all", **_scaled_lr(cfg, lr_scale), "epochs": cfg["local-epochs"],
                 "report-loss-before": "retain"}
        baseline: dict[int, float] = {}
        before = None  # the state before the last applied restore step
        judged: list[tuple[dict, State]] = []  # (retained loss-before per node, the state it judges)
        rounds = cfg["lethe.restore-rounds"]
        target = None if target_reference is None else target_reference + RESTORE_TARGET_RISE
        for t in range(1, rounds + (cfg["guard.restore-extra-rounds"] if rounds else 0) + 1):
            round_no = cfg["lethe.rectify-rounds"] + t
            check = fallback is not None and t == 1
            forget_views, retain_views, forget_loss = self._streams(
                ctx, state, [], round_no=round_no, stop_loss=cfg["guard.stop-loss"] if check else None, **local)
            fed.cost(fed.phase).rounds += 1
            if check:
                verdict = rectify_verdict(forget_loss, guard.get("stop_loss", cfg["guard.stop-loss"]), None, None,
                                          retain_rise)
                if verdict in ("explode", "overshoot"):
                    log.warning("[lethe] guard: the last rectify step gives forget loss %.3g (%s): rolled back",
                                forget_loss, verdict)
                    guard.update({"action": "rolled-back", "round": cfg["lethe.rectify-rounds"], "verdict": verdict,
                                  "forget_loss": forget_loss})
                    state = fallback
                    forget_views, retain_views, _ = self._streams(ctx, state, [], round_no=round_no, **local)
                    fed.cost(fed.phase).rounds += 1
                    if checkpoints:
                        checkpoints.pop()  # the fallback is the newest checkpoint
            if t == 1 and reference is not None:
                undone = None  # the last state walked back from
                while checkpoints and not _backbone_ok(retain_views, reference, backbone_rise):
                    loss = mean_loss(retain_views)
                    log.warning("[lethe] guard: the rectified backbone's retained loss is %.3g against %.3g on the "
                                "start: one rectification step undone", loss, reference)
                    guard.setdefault("backbone_steps_undone", []).append(loss)
                    undone, state = state, checkpoints.pop()
                    forget_views, retain_views, _ = self._streams(ctx, state, [], round_no=round_no, **local)
                    fed.cost(fed.phase).rounds += 1
                if undone is not None and WALK_BACK_SEARCH and _backbone_ok(
                        retain_views, reference, backbone_rise):
                    state, forget_views, retain_views = self._backbone_search(
                        ctx, state, undone, (forget_views, retain_views), reference, round_no, local, guard,
                        checkpoints)
                guard["backbone_retain_loss"] = mean_loss(retain_views)
            if t == 1:
                baseline = {v["node"]: float(v["metrics"]["loss"]) for v in retain_views}
            extra = t > rounds
            if extra:  # an extra round (see below): its reports judge the last step's model first
                judged.append((losses_before(retain_views), state))
                if not _short_of_target(judged, target):
                    break
                guard["restore_extra_rounds"] = t - rounds
                log.info("[lethe] restore: no model restore may keep is within %.3g nats of the retained loss on the "
                         "start (best %.3g): extra round %d", RESTORE_TARGET_RISE, _best_candidate(judged),
                         t - rounds)
            now, then = retain_losses(retain_views, baseline)
            if not extra and before is not None and now is not None and not (
                    math.isfinite(now) and now <= then + retain_rise):
                log.warning("[lethe] guard: after restore round %d the retained loss is %.3g against %.3g: "
                            "that step is rolled back, restore stops", t - 1, now, then)
                guard["restore_rolled_back_round"] = t - 1
                state = before
                break
            if not extra:
                judged.append((losses_before(retain_views), state))
            forget = mean_update(forget_views, state, param_names)
            retain = mean_update(retain_views, state, param_names)
            update = remove_forget_component(retain, forget)
            if extra:
                update = scale_update(update, EXTRA_STEP)
            candidate = apply_step(state, update, retain_views, buffer_names)
            if nonfinite_tensors(candidate):
                log.warning("[lethe] guard: restore round %d would make the model non-finite: not applied, "
                            "restore stops", t)
                guard["restore_stopped_round" if extra else "restore_refused_round"] = t
                break
            before, state = state, candidate
            aligned = sum(1 for s in layer_alignment(retain, forget).values() if s > 0)
            log.info("[lethe] restore round %d/%d: forget component removed from %d/%d layers", t, rounds, aligned,
                     len(param_names))
        else:
            if judged:  # the last step's model: one more round of reports, without training
                _, retain_views, _ = self._streams(ctx, state, [], round_no=cfg["lethe.rectify-rounds"] + t + 1,
                                                   **{**local, "epochs": 0, "llm-epochs": 0})
                fed.cost(fed.phase).rounds += 1
                judged.append((losses_before(retain_views), state))
        return _best_restored(judged, guard) if judged else state

    def _backbone_search(self, ctx: UnlearnContext, start: State, undone: State, views, reference: float,
                         round_no: int, local: dict, guard: dict, checkpoints: list[State]):
        """The walk-back went back to ``start`` (its retained loss within ``guard.walk-back``) from
        ``undone`` (above it): bisect the undone step, ``start + f (undone - start)``, for the largest
        ``f`` whose retained loss is at most ``start``'s own plus ``WALK_BACK_SEARCH_RISE`` (and within
        ``guard.walk-back`` of ``reference``), so that less of the step's forgetting is lost; each of the
        ``WALK_BACK_SEARCH`` probes is one round of both streams from the candidate. Returns ``(state,
        forget views, retain views)`` of the chosen candidate; with ``f > 0`` the ``start`` is put back on
        ``checkpoints`` (a restore retry goes back to it). Recorded: ``guard["backbone_fraction"]``,
        ``guard["backbone_search"]`` (the ``[f, loss]`` probes), ``guard["backbone_checkpoint_loss"]``."""
        cfg, fed = ctx.cfg, ctx.fed
        low, high, best = 0.0, 1.0, (start, *views)
        start_loss = guard["backbone_checkpoint_loss"] = mean_loss(views[1])
        bound = min(reference + cfg["guard.walk-back"],
                    start_loss + WALK_BACK_SEARCH_RISE)
        probes = guard["backbone_search"] = []
        for _ in range(WALK_BACK_SEARCH):
            mid = (low + high) / 2
            candidate = _interpolate(start, undone, mid)
            forget_views, retain_views, _ = self._streams(ctx, candidate, [], round_no=round_no, **local)
            fed.cost(fed.phase).rounds += 1
            loss = mean_loss(retain_views)
            probes.append([mid, loss])
            if math.isfinite(loss) and loss <= bound:
                low, best = mid, (candidate, forget_views, retain_views)
            else:
                high = mid
        guard["backbone_fraction"] = low
        if low > 0:
            checkpoints.append(start)
            log.info("[lethe] guard: the undone rectification step is taken back to x %g (retained loss %.3g)", low,
                     mean_loss(best[2]))
        return best

    def restore_within_bound(self, ctx: UnlearnContext, base: State, fallback: State | None, guard: dict,
                             checkpoints: list[State], start_loss: float | None) -> State:
        """Restore (:meth:`_restore_with_retries`) such that the model it keeps is rated by the retained
        clients at most ``guard.retain-rise`` above ``start_loss`` (their loss of the original,
        :func:`pass_utility`). Where it is not, restore
        runs again from the same backbone and checkpoints with the clients' lr halved, at most
        ``RESTORE_HALVINGS`` times: restore is FedAvg on non-IID clients and can diverge where a smaller
        step does not. The first restore within the bounds is kept, else the one whose kept model the
        retained clients rate best (then :meth:`Lethe.attempt` reports the pass as not carried out).
        ``guard`` ends as the kept attempt's; where more than one ran, ``guard["restore_halvings"]`` lists
        each: ``lr_scale``, ``retain_loss`` (of its kept model), ``kept``."""
        rise = ctx.cfg["guard.retain-rise"]
        attempts: list[_Attempt] = []
        for halving in range(RESTORE_HALVINGS + 1):
            scale = 0.5 ** halving
            attempt_guard = dict(guard)  # every attempt starts from rectification's facts
            model = self._restore_with_retries(ctx, base, fallback, attempt_guard, list(checkpoints), lr_scale=scale)
            attempts.append(_Attempt(scale, pass_utility(attempt_guard, start_loss, rise), attempt_guard, model))
            if not attempts[-1].utility["broken"]:
                break
            if halving < RESTORE_HALVINGS:
                log.warning("[lethe] guard: restore kept a model that broke utility (%s): restore again from the same "
                            "backbone at %g of the lr", broken_because(attempts[-1].utility, start_loss), scale / 2)
        within = [a for a in attempts if not a.utility["broken"]]
        chosen = within[0] if within else min(attempts, key=lambda a: _loss_or_inf(a.utility["retain_loss"]))
        guard.clear()
        guard.update(chosen.guard)
        if len(attempts) > 1:
            guard["restore_halvings"] = [{"lr_scale": a.lr_scale, "retain_loss": a.utility["retain_loss"],
                                          "kept": a is chosen} for a in attempts]
        return chosen.model

    def _restore_with_retries(self, ctx: UnlearnContext, base: State, fallback: State | None, guard: dict,
                              checkpoints: list[State], lr_scale: float = 1.0) -> State:
        """Restore from ``base``; while restore's own rollback acted (a restore step rolled back or
        refused) and rectification checkpoints are left, at most ``RESTORE_RETRIES`` times: restore again
        from the backbone one rectification step earlier (``guard["restore_retries"]`` records what each
        failed attempt's guard did)."""
        for attempt in range(RESTORE_RETRIES + 1):
            result = self.restore_rounds(ctx, base, fallback=fallback, guard=guard, checkpoints=checkpoints,
                                         reference=guard.get("baseline_retain_loss"),
                                         target_reference=guard.get("start_retain_loss"), lr_scale=lr_scale)
            failed = {k: guard[k] for k in RESTORE_FAILED if k in guard}
            if not failed or not checkpoints or attempt == RESTORE_RETRIES:
                return result
            log.warning("[lethe] guard: restore from the rectified backbone failed (%s): restore again from one "
                        "rectification step earlier", failed)
            guard.setdefault("restore_retries", []).append(failed)
            for k in failed:
                del guard[k]
            base, fallback = checkpoints.pop(), None
        return result


def pass_utility(guard: dict, start_loss: float | None, max_rise: float) -> dict:
    """Did a pass break utility? Its restored model's retained loss (the retained clients' loss of
    the model restore kept, ``guard["restore_losses"]``) against ``start_loss`` (their loss on the
    original) + ``max_rise``; not judged (``broken`` false) where restore reports no such loss."""
    losses, kept = guard.get("restore_losses"), guard.get("restore_kept")
    if not losses or kept is None or start_loss is None:
        return {"retain_loss": None, "bound": None, "broken": False}
    loss, bound = float(losses[kept]), start_loss + max_rise
    return {"retain_loss": loss, "bound": bound, "broken": not (math.isfinite(loss) and loss <= bound)}


def broken_because(utility: dict, start_loss: float | None) -> str:
    """One line: the bounds of :func:`strategies.lethe.restore.pass_utility`'s verdict that a pass broke."""
    parts = []
    if utility["retain_loss"] is not None and not utility["retain_loss"] <= utility["bound"]:
        parts.append(f"retained loss {utility['retain_loss']:.3g} against {start_loss:.3g} on the original, bound "
                     f"{utility['bound']:.3g}")
    return "; ".join(parts)


def _scaled_lr(cfg, scale: float) -> dict:
    """The lr keys of restore's local training at ``scale`` of the run's: ``lr`` (vision and text
    tasks) and, where scaled, ``llm.lr`` (the LLM task trains on that one)."""
    return {"lr": cfg["lr"] * scale, **({"llm.lr": cfg["llm.lr"] * scale} if scale != 1.0 else {})}


def _loss_or_inf(loss: float | None) -> float:
    return math.inf if loss is None or not math.isfinite(loss) else loss


def _best_restored(judged: list[tuple[dict, State]], guard: dict) -> State:
    """Of the models restore went through (the one it started from, then one per step), the one after
    at least ``MIN_RESTORE_STEPS`` restore steps (one where restore applied only one) that the
    retained clients rate best: the lowest count-weighted loss of the received model on their data,
    over the clients that reported on every one of them (ties: the later model). With no step
    applied, the model restore started from.

    Restore is FedAvg-like on non-IID clients, and its last round is not always its best. The models
    before two restore steps are no candidates: restore also makes the forgetting last, and a barely
    restored backbone lets continued training bring the forget data back. A non-finite report is
    never chosen. ``guard["restore_losses"]`` holds the losses (index 0: the model restore started
    from), ``guard["restore_kept"]`` the chosen index."""
    means = _judged_means(judged)
    candidates = _candidates(len(means))
    kept = min(candidates, key=lambda i: (means[i], -i))
    guard["restore_losses"], guard["restore_kept"] = means, kept
    if kept != len(judged) - 1:
        log.info("[lethe] restore: of the models after restore step %d or later, the one after step %d has the "
                 "lowest retained loss (%.3g against %.3g for the last): kept", candidates.start, kept, means[kept],
                 means[-1])
    return judged[kept][1]


def _judged_means(judged: list[tuple[dict, State]]) -> list[float]:
    """Per judged model, the count-weighted mean loss-before over the retained clients that reported on
    every one of them (``inf`` where non-finite or nobody did)."""
    common = set.intersection(*(set(losses) for losses, _ in judged))
    means = []
    for losses, _ in judged:
        total = sum(losses[n][0] for n in common)
        mean = sum(losses[n][0] * losses[n][1] for n in common) / total if total else math.nan
        means.append(mean if math.isfinite(mean) else math.inf)
    return means


def _candidates(count: int) -> range:
    """The indices, among ``count`` judged models, of those restore may keep: the ones after at least
    ``MIN_RESTORE_STEPS`` steps, or after the one step applied (0 where none was: the start)."""
    return range(min(MIN_RESTORE_STEPS, count - 1), count)


def _best_candidate(judged: list[tuple[dict, State]]) -> float:
    """The lowest retained loss among the models restore may keep (:func:`_candidates`)."""
    means = _judged_means(judged)
    return min(means[i] for i in _candidates(len(means)))


def _short_of_target(judged: list[tuple[dict, State]], target: float | None) -> bool:
    """No model restore may keep (:func:`_candidates`; at least one step applied) has a retained loss
    at or below ``target`` (``None``: no target, never short). The same candidates as
    :func:`_best_restored`'s: a model it would never keep cannot end the extra rounds."""
    return target is not None and len(judged) > 1 and _best_candidate(judged) > target


def _backbone_ok(retain_views, reference: float, max_rise: float) -> bool:
    loss = mean_loss(retain_views)
    return math.isfinite(loss) and loss <= reference + max_rise


def _interpolate(start: State, end: State, fraction: float) -> State:
    """``start + fraction (end - start)`` on the floating-point tensors (others keep ``start``'s)."""
    return {k: start[k] + fraction * (end[k] - start[k]) if start[k].is_floating_point() else start[k]
            for k in start}

