"""Lethe (amplify -> rectify -> restore, its Algorithm 1) as a Flower strategy.

1. **Amplify** (``lethe-adapter-steps`` > 0): a temporary adapter (``strategies.lethe.adapter``) is
   attached between extractor and head; the client(s) holding forget data train only the adapter by
   bounded gradient ascent on it (eq. 6); the server averages the adapters by forget counts (class
   scenario: every client holding the class) and freezes it. Uploaded once, broadcast once.
2. **Rectify** (at most ``lethe-rectify-rounds``): each round the composite model goes to the forget
   clients (forget stream, eq. 7: ordinary local training on the forget data) and to the retained
   clients (retain stream, eq. 8, weighted by counts), both trained with ``lethe-lr`` (class
   scenario: ``lethe-lr-class``; its update clip is ``lethe-step-clip-class``) for
   ``lethe-epochs`` (small, as the paper's 1e-3: the rule negates the forget stream when the
   streams anti-align, so a large forget step is a large ascent step); only the backbone trains. Per named
   parameter tensor the server applies eq. 10 with the gamma of ``lethe-gamma-mode`` (default
   ``upper``: each layer's upper Prop. IV.1 bound) and eq. 11. Buffers (BatchNorm statistics) are
   not parameters: they take the retain stream's average. Each round logs, per layer, the
   Proposition IV.1 bounds of gamma and whether the chosen gamma is inside them. Our stopping rule
   (the paper runs a fixed T): the forget clients report their forget loss of the received
   backbone with the adapter bypassed; once its forget-count-weighted mean reaches
   ``lethe-stop-loss`` the phase ends (that round's streams are not applied).
   Our guard (``rectify_rounds``): each round's reports also judge the step before it — a forget
   loss past 3x the stop or a non-finite report has that step halved (each half checked again) or
   rolled back, a retained loss more than ``lethe-max-retain-rise`` above the retained clients'
   loss on the starting model rolls it back, and a step that would make the model non-finite is
   never applied; what the guard did is recorded under ``method.rectify_guard``.
3. **Restore** (``lethe-restore-rounds``): the adapter is dropped. ``lethe-restore-mode=fedavg`` is the
   paper's FedAvg on retained clients. ``rectified`` (default, ours) keeps the forget clients in:
   each round both groups train the adapter-free model with the run's ``lr`` / ``local-epochs`` and
   the server applies the retain stream minus its component along the forget stream wherever
   they align (``strategies.lethe.maths.remove_forget_component``). Measured on digits, plain FedAvg restore
   brought a backdoor that rectification had removed back to 0.2–0.6 within one round; the
   rectified restore kept it at 0 through 20 continued FedAvg rounds.

4. **Verify** (ours, ``lethe-verify-passes``): the forget clients evaluate the restored model; while
   it still predicts too much of the forget set as its label (:meth:`Lethe.still_known`), the three
   phases run again from it, with a stop counted from where that pass starts.

A forget client that fails during amplify or rectify ends the phase (``RoundFailed`` naming the
phase and round); the original model is never modified, so it stays intact.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp.strategy import FedAvg

from strategies.common.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod
from strategies.common.fedavg_rounds import RoleFedAvg, mean_update, run_rounds
from strategies.common.federation import RoundFailed, RunStopped
from strategies.common.updates import apply_update
from strategies.lethe.adapter import ADAPTER_KIND
from strategies.lethe.maths import (check_gamma, clip_reference, clip_to_reference, feasible_gamma_range, gamma_bounds,
                                    layer_alignment, layer_gammas, lift_retain, rectify, rectify_verdict,
                                    remove_forget_component, scale_update)
from strategies.lethe.settings import scenario_setting
from tasks.model import PLUGIN_PREFIX
from tasks.plugins import specs_to_json
from tasks.validity import nonfinite_tensors

log = logging.getLogger("fedunlearn")

SHRINK_TRIES = 3  # halvings of an overshooting rectification step before it is rolled back
REFERENCE_SEARCH = 3  # bisection steps of the client scenario's last step towards the reference
EXTRA_STEP = 0.5  # the share of its update an extra restore round applies (restore_rounds says why)
MIN_RESTORE_STEPS = 2  # restore keeps a model after at least this many of its steps, where it took as many
VERIFY_Z = 1.645  # one-sided 95 % normal quantile: the client check's margin over the clean-data reference

State = dict[str, torch.Tensor]


def _step(state: State, update: State, retain_views, buffer_names: list[str]) -> State:
    """Eq. 11 on the parameters; buffers (BatchNorm statistics) take the retain stream's average."""
    new = {**state, **apply_update({k: state[k] for k in update}, update)}
    if buffer_names:
        buffers = mean_update(retain_views, state, buffer_names)
        new.update({k: (state[k] + buffers[k]).to(state[k].dtype) for k in buffer_names})
    return new


def _forget_loss(views) -> float:
    """Forget-count-weighted mean of the forget clients' ``loss-before`` (the received backbone's
    forget loss, adapter bypassed)."""
    counts = [int(v["metrics"]["num-examples"]) for v in views]
    losses = [float(v["metrics"]["loss-before"]) for v in views]
    return sum(n * v for n, v in zip(counts, losses)) / max(1, sum(counts))


def _train_content(arrays: ArrayRecord, plugins: list[dict], *, role: str, round_no: int, **config) -> RecordDict:
    """A ``train`` message's content: the model (built once per round and shared) and its config."""
    return RecordDict({"arrays": arrays, "config": ConfigRecord(
        {"role": role, "plugins": specs_to_json(plugins), "server-round": round_no, **config})})


def _role_view(reply: Message, role: str) -> dict:
    """``{"arrays", "metrics", "node"}`` of one role in a reply (a ``forget+retain`` reply holds both)."""
    content, node = reply.content, reply.metadata.src_node_id
    if "arrays" in content:
        return {"arrays": content["arrays"], "metrics": content["metrics"], "node": node}
    return {"arrays": content[f"arrays.{role}"], "metrics": content[f"metrics.{role}"], "node": node}


def _retain_losses(views, baseline: dict[int, float]) -> tuple[float | None, float | None]:
    """Count-weighted mean reported retained loss of ``views`` and of the same nodes in ``baseline``
    (their loss on the model rectification started from); ``(None, None)`` if no node is in both."""
    pairs = [(int(v["metrics"]["num-examples"]), float(v["metrics"]["loss"]), baseline[v["node"]])
             for v in views if v["node"] in baseline]
    total = sum(n for n, _, _ in pairs)
    if not total:
        return None, None
    return sum(n * now for n, now, _ in pairs) / total, sum(n * then for n, _, then in pairs) / total


class Lethe(FedAvg, UnlearningMethod):
    """Lethe's three phases driven against the federation (FedAvg aggregates the adapters)."""

    name = "lethe"

    def __init__(self):
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, weighted_by_key="num-examples",
                         arrayrecord_key="arrays", configrecord_key="config")
        self.round_offset = 0  # added to every round number of a pass: a later pass gets its own seeds

    @property
    def later_pass(self) -> bool:
        """A verify pass (see :meth:`unlearn`): its loss stop counts from its start."""
        return self.round_offset > 0

    def _streams(self, ctx: UnlearnContext, state: State, plugins: list[dict], *, round_no: int,
                 stop_loss: float | None = None, **config) -> tuple[list, list, float]:
        """One round of both streams: ``(forget views, retain views, forget loss)``.

        The forget clients go first (every one must answer); a client that also holds retained
        data gets one message with role ``forget+retain`` and returns both updates, so it downloads
        the model once. With ``stop_loss`` set, the forget clients also report their forget loss of
        the received backbone (else the loss is ``nan``); ``report-loss-before='retain'`` in
        ``config`` has the retained clients report theirs on the received model (restore's choice).
        The retained clients are asked in every round, the one where the stopping rule fires
        included: their reported loss is what the utility guard of :meth:`rectify_rounds` checks
        the last step against."""
        fed = ctx.fed
        round_no += self.round_offset
        forget_nodes, retain_nodes = fed.nodes_with("n-forget"), fed.nodes_with("n-retain")
        both = set(forget_nodes) & set(retain_nodes)
        arrays = ArrayRecord(state)
        asked = [role for role in str(config.get("report-loss-before", "")).split(",") if role]
        reported = (["forget"] if stop_loss is not None else []) + asked
        forget_config = {**config, "report-loss-before": ",".join(reported), "loss-before-bypass": ADAPTER_KIND}
        contents = {role: _train_content(arrays, plugins, role=role, round_no=round_no, **forget_config)
                    for role in ("forget", "forget+retain")}
        messages = [Message(contents["forget+retain" if n in both else "forget"], dst_node_id=n, message_type="train")
                    for n in forget_nodes]
        replies = fed.exchange(messages, round_no=round_no, require_all=True)
        forget_views = [_role_view(r, "forget") for r in replies]
        forget_loss = _forget_loss(forget_views) if stop_loss is not None else math.nan
        retain_views = [_role_view(r, "retain") for r in replies if r.metadata.src_node_id in both]
        others = [n for n in retain_nodes if n not in both]
        if others:
            retain_config = {**config, "loss-before-bypass": ADAPTER_KIND} if asked else config
            content = _train_content(arrays, plugins, role="retain", round_no=round_no, **retain_config)
            retain_views += [_role_view(r, "retain") for r in fed.broadcast(others, "train", content, round_no=round_no)]
        if not retain_views:
            raise RoundFailed(f"phase '{fed.phase}' round {round_no}: no retained client replied")
        return forget_views, retain_views, forget_loss

    def amplify(self, ctx: UnlearnContext) -> tuple[State, list[dict], dict]:
        """Phase 1: the original model with a trained, frozen temporary adapter (or none)."""
        cfg = ctx.cfg
        base = ctx.original.arrays.to_torch_state_dict()
        if cfg["lethe-adapter-steps"] == 0:
            return base, [], {"adapter": "none"}
        plugins = [{"kind": ADAPTER_KIND, "seed": cfg["seed"]}]
        model = ctx.model_factory(plugins)
        model.load_state_dict({**model.state_dict(), **base})
        round_no = 1 + self.round_offset
        content = _train_content(ArrayRecord(model.state_dict()), plugins, role="forget", round_no=round_no,
                                 objective="adapter-ascent", scope="plugins",
                                 **{"max-steps": cfg["lethe-adapter-steps"], "lr": cfg["lethe-adapter-lr"]})
        replies = ctx.fed.broadcast(ctx.fed.nodes_with("n-forget"), "train", content, round_no=round_no,
                                    require_all=True)
        ctx.fed.cost(ctx.fed.phase).rounds += 1
        adapter, _ = self.aggregate_train(1, replies)
        losses = [float(r.content["metrics"]["loss"]) for r in replies]
        return {**model.state_dict(), **adapter.to_torch_state_dict()}, plugins, {"adapter_final_loss": losses}

    def rectify_rounds(self, ctx: UnlearnContext, state: State, plugins: list[dict]) -> tuple[State, list, dict]:
        """Phase 2: at most ``lethe-rectify-rounds`` rounds of dual-stream rectification of the backbone.

        Returns the rectified state, the per-round history and the guard's record. The guard (ours):
        every round's reports judge the model the previous step produced (``rectify_verdict``): a
        non-finite report or a forget loss past 3x ``lethe-stop-loss`` has that step halved (at most
        ``SHRINK_TRIES`` times, each half checked by one more round of reports) or else rolled
        back; a retained loss more than ``lethe-max-retain-rise`` nats above the retained clients'
        loss on the starting model rolls the step back. A rollback ends rectification, and so does a
        shortened step at or past the stop; a shortened step still short of it is kept and
        rectification goes on from it (``guard["shrunk_then_on"]``: measured, seed 15, 7 clients
        alpha 0.1, client: the forget loss stayed 0 for four rounds, the fifth step jumped to 84
        nats, its half gave 0.0003 — nothing forgotten had rectification stopped there). A step whose
        result would be non-finite is never applied. ``guard["unchecked"]`` holds the last step
        when the round cap ended the phase before any report judged it (restore checks it)."""
        cfg, fed = ctx.cfg, ctx.fed
        param_names = [n for n, _ in ctx.model_factory(plugins).named_parameters()
                       if not n.startswith(PLUGIN_PREFIX)]
        buffer_names = [k for k in state if k not in param_names and not k.startswith(PLUGIN_PREFIX)]
        gamma, history = cfg["lethe-gamma"], []
        # a class needs larger steps (docs/lethe.md, "In the app")
        lr, step_clip = scenario_setting(cfg, "lethe-lr"), scenario_setting(cfg, "lethe-step-clip")
        clip_floor = scenario_setting(cfg, "lethe-clip-floor")
        lift_on = scenario_setting(cfg, "lethe-lift-retain")
        lift_floor = clip_floor if lift_on else 0.0
        if lift_on and self.later_pass:  # restore has just fit the retained data (lethe-verify-lift)
            lift_floor = max(lift_floor, cfg["lethe-verify-lift"])
        local = {"scope": "base", "lr": lr, "epochs": cfg["lethe-epochs"]}
        judge = _Judge(cfg["lethe-stop-loss"], cfg["lethe-max-retain-rise"], relative=self.later_pass)
        guard: dict = {"action": "none"}
        previous = None  # (state before the last applied step, the step, its retain views, its round)
        checkpoints: list[State] = []  # the state before every applied step, oldest first
        start_loss = None  # the retained clients' loss of the starting backbone (round 1's loss-before)
        for t in range(1, cfg["lethe-rectify-rounds"] + 1):
            ask_start = {"report-loss-before": "retain"} if t == 1 else {}
            forget_views, retain_views, forget_loss = self._streams(ctx, state, plugins, round_no=t,
                                                                    stop_loss=cfg["lethe-stop-loss"], **local,
                                                                    **ask_start)
            fed.cost(fed.phase).rounds += 1
            if t == 1 and all("loss-before" in v["metrics"] for v in retain_views):
                start_loss = _mean_loss(retain_views, "loss-before")
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
                                 f"non-finite on the starting model (norms {norms}); lower lethe-lr")
            if verdict == "stop" and not self._forgotten(ctx, state, t, entry):
                verdict = "go"
            if verdict == "go" and t > 1 and self._at_reference(ctx, state, t, entry):
                verdict = "stop"
            if verdict != "go":
                log.info("[lethe] rectify round %d: the backbone's forget loss %.3g against the stop %g: "
                         "rectification stops", t, forget_loss, judge.stop_loss)
                history.append({**entry, "stopped": True})
                if previous is not None and self._reference_on(cfg) and "forget_reference" not in entry:
                    state, guard["reference_search"] = self._back_to_reference(ctx, state, previous, t, buffer_names)
                break
            retain, lift = lift_retain(retain, forget, lift_floor)
            bounds = gamma_bounds(retain, forget)
            gammas = layer_gammas(bounds, gamma, cfg["lethe-gamma-mode"])
            inside = check_gamma(bounds, gammas)
            update = clip_to_reference(rectify(retain, forget, gammas), clip_reference(retain, forget, clip_floor),
                                       step_clip)
            candidate = _step(state, update, retain_views, buffer_names)
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
                     t, cfg["lethe-rectify-rounds"], norms["retain"], lift, norms["forget"], forget_loss,
                     "n/a" if retain_loss is None else f"{retain_loss:.3g}", len(aligned), len(bounds),
                     cfg["lethe-gamma-mode"], sum(inside[k] for k in aligned))
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
            guard["stop_loss"] = judge.stop_loss  # this pass's stop: lethe-stop-loss above its start
        guard["checkpoints"] = [c for c in checkpoints if c is not state]
        return state, history, guard

    def _forgotten(self, ctx: UnlearnContext, state: State, round_no: int, entry: dict) -> bool:
        """Our stop condition beside the mean forget loss: the share of the forget set the backbone
        (adapter bypassed) still predicts as its label is at most ``lethe-stop-forget-acc`` (1 = not
        asked). One ``evaluate`` message to each forget client; measured (seed 11, 7 clients, sample),
        a mean of 12.5 nats hid 17.5 % of the forget set still carrying the backdoor."""
        limit = scenario_setting(ctx.cfg, "lethe-stop-forget-acc")
        if self.later_pass and limit < 1:
            limit = ctx.cfg["lethe-verify-forget-acc"]
        if limit >= 1:
            return True
        acc = entry["forget_acc"] = self._forget_accuracy(ctx, state, round_no)
        if acc > limit:
            log.info("[lethe] rectify round %d: forget loss at the stop, but the backbone still predicts %.3f of "
                     "the forget set as its label (> lethe-stop-forget-acc %g): rectification goes on",
                     round_no, acc, limit)
        return acc <= limit

    def _repair(self, ctx: UnlearnContext, plugins: list[dict], previous, verdict: str, judge: "_Judge",
                round_no: int, buffer_names: list[str], local: dict) -> tuple[State, dict]:
        """The step of ``previous`` broke something (``verdict``): shorten it (overshoot, explode) or
        roll it back (utility, or when no shortened step passes). Returns the state and the record."""
        fed, cfg = ctx.fed, ctx.cfg
        start, step, retain_views, step_round = previous
        record = {"round": step_round, "verdict": verdict}
        if verdict != "utility":
            for k in range(1, SHRINK_TRIES + 1):
                factor = 0.5 ** k
                candidate = _step(start, scale_update(step, factor), retain_views, buffer_names)
                if nonfinite_tensors(candidate):
                    continue
                _, views, forget_loss = self._streams(ctx, candidate, plugins, round_no=round_no,
                                                      stop_loss=cfg["lethe-stop-loss"], **local)
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

    @staticmethod
    def _reference_on(cfg) -> bool:
        # lethe-stop-loss=inf means "always lethe-rectify-rounds": no early stop of any kind
        return (cfg["scenario"] == "client" and cfg["lethe-stop-at-reference-client"]
                and math.isfinite(cfg["lethe-stop-loss"]))

    def _back_to_reference(self, ctx: UnlearnContext, state: State, previous, round_no: int,
                           buffer_names: list[str]) -> tuple[State, dict]:
        """The loss stop fired in the client scenario: if the last step took the backbone's target
        share of the forget set below the reference (``_at_reference``), shorten that step to the
        shortest of the factors 1, 1/2 ... (bisection, ``REFERENCE_SEARCH`` evaluations of the
        forget clients, no training) whose share is still at most the reference. Measured (seed 21,
        client, 10 clients): one step took the share 0.39 -> past the stop, U-KR 0.064 against
        retrain's 0.200 (the reference there: 0.18)."""
        start, step, retain_views, _ = previous
        acc, reference = self._forget_eval(ctx, state, round_no)
        record = {"reference": reference, "full_step_forget_acc": acc, "factor": 1.0}
        if acc > reference:
            return state, record
        low, high, best = 0.0, 1.0, state
        for _ in range(REFERENCE_SEARCH):
            mid = (low + high) / 2
            candidate = _step(start, scale_update(step, mid), retain_views, buffer_names)
            acc_mid, _ = self._forget_eval(ctx, candidate, round_no)
            if acc_mid > reference:
                low = mid
            else:
                high, best, acc = mid, candidate, acc_mid
        log.info("[lethe] rectify: the last step shortened to x %g (target share %.3f, reference %.3f)", high, acc,
                 reference)
        return best, {**record, "factor": high, "forget_acc": acc}

    def _at_reference(self, ctx: UnlearnContext, state: State, round_no: int, entry: dict) -> bool:
        """Client scenario with ``lethe-stop-at-reference-client`` (ours): has the backbone (adapter
        bypassed) stopped predicting the leaving client's triggered data as the target more often
        than it predicts the client's own clean local test data of the other classes (the same
        client's distribution, no trigger) as the target? That share is what a model without the
        backdoor does, and the loss stop alone can drive the share below it (measured when the forget
        set still held the target class: 0.05 / 0.025 against retrain's 0.313 / 0.113). One
        ``evaluate`` message to each forget client per round."""
        if not self._reference_on(ctx.cfg):
            return False
        forget_acc, reference = self._forget_eval(ctx, state, round_no)
        entry.update(forget_acc=forget_acc, forget_reference=reference)
        if forget_acc <= reference:
            log.info("[lethe] rectify round %d: the backbone predicts %.3f of the forget set as the target, at most "
                     "the %.3f of the forget clients' clean test data: rectification stops", round_no, forget_acc,
                     reference)
        return forget_acc <= reference

    def _forget_counts(self, ctx: UnlearnContext, state: State, round_no: int) -> dict[str, int] | None:
        """One ``evaluate`` message to each forget client with ``state``'s backbone: the summed counts
        ``forget-correct`` / ``forget-n`` (their forget data predicted as its label) and
        ``clean-hit`` / ``clean-n`` (their clean local test data whose true label is not
        ``backdoor-target``, predicted as it); ``None`` on a task whose clients report no such counts
        (the LLM task)."""
        content = RecordDict({"arrays": ArrayRecord(_backbone(state)),
                              "config": ConfigRecord({"plugins": specs_to_json([])})})
        replies = ctx.fed.broadcast(ctx.fed.nodes_with("n-forget"), "evaluate", content,
                                    round_no=round_no + self.round_offset, require_all=True)
        metrics = [r.content["metrics"] for r in replies]
        keys = ("forget-correct", "forget-n", "pred-target-n", "pred-target-correct", "test-n", "test-target-n")
        if not all(k in m for m in metrics for k in keys):
            return None
        total = {k: sum(int(m[k]) for m in metrics) for k in keys}
        return {"forget-correct": total["forget-correct"], "forget-n": total["forget-n"],
                "clean-hit": total["pred-target-n"] - total["pred-target-correct"],
                "clean-n": total["test-n"] - total["test-target-n"]}

    def _forget_eval(self, ctx: UnlearnContext, state: State, round_no: int) -> tuple[float, float]:
        """``(forget accuracy, target share)`` of ``state``'s backbone at the forget clients (see
        :meth:`_forget_counts`); ``(0, 0)`` where the task reports no counts: nothing is judged known."""
        counts = self._forget_counts(ctx, state, round_no)
        if counts is None:
            return 0.0, 0.0
        return (counts["forget-correct"] / max(1, counts["forget-n"]),
                counts["clean-hit"] / counts["clean-n"] if counts["clean-n"] else 0.0)

    def _forget_accuracy(self, ctx: UnlearnContext, state: State, round_no: int) -> float:
        """The forget clients' share of their forget data that ``state``'s backbone predicts as its label."""
        return self._forget_eval(ctx, state, round_no)[0]

    def restore_rounds(self, ctx: UnlearnContext, state: State, *, fallback: State | None = None,
                       guard: dict | None = None, checkpoints: list[State] | None = None,
                       reference: float | None = None, target_reference: float | None = None) -> State:
        """Phase 3, ``lethe-restore-mode=rectified`` (our rule): ``lethe-restore-rounds`` rounds in which
        the retained clients train the adapter-free model as in FedAvg (the run's ``lr``,
        ``local-epochs``) and the forget clients do the same on their forget data; the server applies
        the retain stream with its component along the forget stream removed wherever they align
        (``remove_forget_component``), so utility comes back without re-learning the forget data.

        ``fallback``: the model before rectification's last step when no report judged that step
        (the round cap ended rectification). The first restore round's forget clients then also
        report their forget loss of the received model; if it is non-finite or past 3x
        ``lethe-stop-loss`` the step is rolled back (recorded in ``guard``) and the round is run again
        from ``fallback``. A restore round whose result would be non-finite is not applied and ends
        restore (``guard["restore_refused_round"]``): the model stays the last finite one, which the
        run then evaluates (and its validity check judges) like any other. A round whose retained
        clients report a loss more than ``lethe-max-retain-rise`` above their report of the first
        restore round (or a non-finite one) shows that the previous restore step broke utility: that
        step is rolled back and restore stops (``guard["restore_rolled_back_round"]``; measured: seed
        12, 10 clients alpha 0.5, class — restore took test accuracy to 0.08 and then to NaN).

        ``checkpoints`` (the adapter-free backbones before each applied rectification step, oldest
        first; the ones used are popped) and ``reference`` (the retained clients' training loss in
        rectification's first round, on the model it started from with the adapter on): rectification
        judged its steps through the adapter; the first
        restore round is the first report on the backbone alone. While its retained loss is more
        than ``lethe-max-backbone-rise`` above ``reference`` (or non-finite), the rectified backbone
        is broken without its adapter: restore goes back one rectification step (the round is run
        again; ``guard["backbone_steps_undone"]``), at worst to the original; then the largest passing
        fraction of the step undone last is taken back (:meth:`_backbone_search`).

        Extra rounds (ours): while no model after a restore step has a retained loss (its reports,
        as :func:`_best_restored` reads them) within ``lethe-restore-target-rise`` of
        ``target_reference`` (the same clients' loss of the model rectification started from, read
        the same way: the received backbone, adapter bypassed, before any training),
        at most ``lethe-restore-extra-rounds`` more rounds follow, each applying ``EXTRA_STEP`` of its
        update (``guard["restore_extra_rounds"]``); the first model within the target ends restore.
        Measured (seed 11, 7 clients alpha 0.1, class): five rounds swung the retained loss to 2.6
        and 4.3 and the best of them was 0.51 above the original (test accuracy 0.819 against
        retrain's 0.960); ten extra full steps kept swinging (best 0.139, test 0.919); half steps
        reached 0.078 after nine (test 0.947). Restore's own rollback guard does not judge extra
        rounds (they only ever add candidates), and one that would make the model non-finite ends
        them (``guard["restore_stopped_round"]``) without counting as a failed restore."""
        cfg, fed = ctx.cfg, ctx.fed
        guard = {} if guard is None else guard
        param_names = [n for n, _ in ctx.model_factory([]).named_parameters()]
        buffer_names = [k for k in state if k not in param_names]
        local = {"scope": "all", "lr": cfg["lr"], "epochs": cfg["local-epochs"], "report-loss-before": "retain"}
        baseline: dict[int, float] = {}
        before = None  # the state before the last applied restore step
        judged: list[tuple[dict, State]] = []  # (retained loss-before per node, the state it judges)
        rounds = cfg["lethe-restore-rounds"]
        target = None if target_reference is None else target_reference + cfg["lethe-restore-target-rise"]
        for t in range(1, rounds + (cfg["lethe-restore-extra-rounds"] if rounds else 0) + 1):
            round_no = cfg["lethe-rectify-rounds"] + t
            check = fallback is not None and t == 1
            forget_views, retain_views, forget_loss = self._streams(
                ctx, state, [], round_no=round_no, stop_loss=cfg["lethe-stop-loss"] if check else None, **local)
            fed.cost(fed.phase).rounds += 1
            if check:
                verdict = rectify_verdict(forget_loss, guard.get("stop_loss", cfg["lethe-stop-loss"]), None, None,
                                          cfg["lethe-max-retain-rise"])
                if verdict in ("explode", "overshoot"):
                    log.warning("[lethe] guard: the last rectify step gives forget loss %.3g (%s): rolled back",
                                forget_loss, verdict)
                    guard.update({"action": "rolled-back", "round": cfg["lethe-rectify-rounds"], "verdict": verdict,
                                  "forget_loss": forget_loss})
                    state = fallback
                    forget_views, retain_views, _ = self._streams(ctx, state, [], round_no=round_no, **local)
                    fed.cost(fed.phase).rounds += 1
                    if checkpoints:
                        checkpoints.pop()  # the fallback is the newest checkpoint
            if t == 1 and reference is not None:
                undone = None  # the last state walked back from
                while checkpoints and not _backbone_ok(retain_views, reference, cfg["lethe-max-backbone-rise"]):
                    loss = _mean_loss(retain_views)
                    log.warning("[lethe] guard: the rectified backbone's retained loss is %.3g against %.3g on the "
                                "start: one rectification step undone", loss, reference)
                    guard.setdefault("backbone_steps_undone", []).append(loss)
                    undone, state = state, checkpoints.pop()
                    forget_views, retain_views, _ = self._streams(ctx, state, [], round_no=round_no, **local)
                    fed.cost(fed.phase).rounds += 1
                if undone is not None and cfg["lethe-backbone-search"] and _backbone_ok(
                        retain_views, reference, cfg["lethe-max-backbone-rise"]):
                    state, forget_views, retain_views = self._backbone_search(
                        ctx, state, undone, (forget_views, retain_views), reference, round_no, local, guard,
                        checkpoints)
                guard["backbone_retain_loss"] = _mean_loss(retain_views)
            if t == 1:
                baseline = {v["node"]: float(v["metrics"]["loss"]) for v in retain_views}
            extra = t > rounds
            if extra:  # an extra round (see below): its reports judge the last step's model first
                judged.append((_losses_before(retain_views), state))
                if not _short_of_target(judged, target):
                    break
                guard["restore_extra_rounds"] = t - rounds
                log.info("[lethe] restore: no restored model is within %.3g nats of the retained loss on the start "
                         "(best %.3g): extra round %d", cfg["lethe-restore-target-rise"], min(_judged_means(judged)[1:]),
                         t - rounds)
            now, then = _retain_losses(retain_views, baseline)
            if not extra and before is not None and now is not None and not (
                    math.isfinite(now) and now <= then + cfg["lethe-max-retain-rise"]):
                log.warning("[lethe] guard: after restore round %d the retained loss is %.3g against %.3g: "
                            "that step is rolled back, restore stops", t - 1, now, then)
                guard["restore_rolled_back_round"] = t - 1
                state = before
                break
            if not extra:
                judged.append((_losses_before(retain_views), state))
            forget = mean_update(forget_views, state, param_names)
            retain = mean_update(retain_views, state, param_names)
            update = remove_forget_component(retain, forget)
            if extra:
                update = scale_update(update, EXTRA_STEP)
            candidate = _step(state, update, retain_views, buffer_names)
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
                _, retain_views, _ = self._streams(ctx, state, [], round_no=cfg["lethe-rectify-rounds"] + t + 1,
                                                   **{**local, "epochs": 0, "llm-epochs": 0})
                fed.cost(fed.phase).rounds += 1
                judged.append((_losses_before(retain_views), state))
        return _best_restored(judged, guard) if judged else state

    def _backbone_search(self, ctx: UnlearnContext, start: State, undone: State, views, reference: float,
                         round_no: int, local: dict, guard: dict, checkpoints: list[State]):
        """The walk-back went back to ``start`` (its retained loss within ``lethe-max-backbone-rise``) from
        ``undone`` (above it): bisect the undone step, ``start + f (undone - start)``, for the largest
        ``f`` whose retained loss is at most ``start``'s own plus ``lethe-backbone-search-rise`` (and
        within ``lethe-max-backbone-rise`` of ``reference``), so that less of the step's forgetting is
        lost. ``lethe-backbone-search`` probes, each one round of both streams from the candidate,
        charged to the phase. Returns ``(state, forget views, retain views)`` of the chosen candidate;
        with ``f > 0`` the ``start`` is put back on ``checkpoints`` (a restore retry goes back to it).
        ``guard["backbone_fraction"]`` is ``f``, ``guard["backbone_search"]`` the ``[f, loss]`` probes,
        ``guard["backbone_checkpoint_loss"]`` ``start``'s retained loss (docs/lethe-log.md, "A fractional
        walk-back")."""
        cfg, fed = ctx.cfg, ctx.fed
        low, high, best = 0.0, 1.0, (start, *views)
        start_loss = guard["backbone_checkpoint_loss"] = _mean_loss(views[1])
        bound = min(reference + cfg["lethe-max-backbone-rise"], start_loss + cfg["lethe-backbone-search-rise"])
        probes = guard["backbone_search"] = []
        for _ in range(cfg["lethe-backbone-search"]):
            mid = (low + high) / 2
            candidate = _interpolate(start, undone, mid)
            forget_views, retain_views, _ = self._streams(ctx, candidate, [], round_no=round_no, **local)
            fed.cost(fed.phase).rounds += 1
            loss = _mean_loss(retain_views)
            probes.append([mid, loss])
            if math.isfinite(loss) and loss <= bound:
                low, best = mid, (candidate, forget_views, retain_views)
            else:
                high = mid
        guard["backbone_fraction"] = low
        if low > 0:
            checkpoints.append(start)
            log.info("[lethe] guard: the undone rectification step is taken back to x %g (retained loss %.3g)", low,
                     _mean_loss(best[2]))
        return best

    def _restore_with_retries(self, ctx: UnlearnContext, base: State, fallback: State | None, guard: dict,
                              checkpoints: list[State]) -> State:
        """Restore from ``base``; while restore's own guard had to act (a restore step rolled back or
        refused: restore diverged from this backbone) and rectification checkpoints are left, at
        most ``lethe-restore-retries`` times: restore again from the backbone one rectification step
        earlier (``guard["restore_retries"]`` records what each failed attempt's guard did)."""
        for attempt in range(ctx.cfg["lethe-restore-retries"] + 1):
            result = self.restore_rounds(ctx, base, fallback=fallback, guard=guard, checkpoints=checkpoints,
                                         reference=guard.get("baseline_retain_loss"),
                                         target_reference=guard.get("start_retain_loss"))
            failed = {k: guard[k] for k in RESTORE_FAILED if k in guard}
            if not failed or not checkpoints or attempt == ctx.cfg["lethe-restore-retries"]:
                return result
            log.warning("[lethe] guard: restore from the rectified backbone failed (%s): restore again from one "
                        "rectification step earlier", failed)
            guard.setdefault("restore_retries", []).append(failed)
            for k in failed:
                del guard[k]
            base, fallback = checkpoints.pop(), None
        return result

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        """Amplify, rectify and restore (:meth:`one_pass`); then, while the forget clients find the
        restored model still knows the forget set (:meth:`still_known`), at most
        ``lethe-verify-passes`` more passes, each from the model the last one left.

        Ours (the paper runs one pass). Measured off the tuned seeds, the guards of one pass can end
        it short of forgetting: a walk-back to a checkpoint that still classifies part of the class
        (seed 14, 10 clients alpha 0.5, class: U-KR 0.216), restore undoing part of the forgetting
        (seed 19, 10 clients, client: 0.408 against retrain's 0.014). The kept model is the last
        pass's when its check passes, else the pass whose model predicts the least of the forget set
        as its label (ties: the earlier). A later pass whose restored model the retained clients rate
        more than ``lethe-max-retain-rise`` nats worse than the original (:func:`_pass_utility`) is
        never kept and ends the passes: measured (seed 26, 7 clients alpha 0.1, class), pass 2 forgot
        the class but left a retained loss of 2.33 against the original's 0.016 (test accuracy 0.611
        against retrain's 0.966). Up to three more passes by default: a second pass can still leave
        the forget set partly known (seed 4, 7 clients alpha 0.1, class: 0.812 after two passes,
        0.000 after three), and a pass only runs where the check before it failed, so a run whose
        first or second check passes gives the model it gave with one pass allowed (docs/lethe-log.md,
        "Up to three verify passes"). ``method.forget_checks`` holds each check, ``method.passes`` the later
        passes' ``gamma_bounds``, ``rectify_guard`` and ``utility``, ``method.kept_pass`` the kept one, and
        ``method.kept_still_knows`` whether the kept model fails its check (then a warning says so: seed 11,
        7 clients alpha 0.1, client, on a later machine kept a pass 1 that still predicted 1.000 of the
        forget set as the target, pass 2 having broken utility)."""
        cfg = ctx.cfg
        self.round_offset = 0
        arrays, details = self.one_pass(ctx)
        models, checks = [arrays], []
        start_loss = details["rectify_guard"].get("start_retain_loss")  # the retained clients' loss of the original
        while cfg["lethe-verify-passes"]:
            # numbered after restore's last round and the reports on its model
            check = self.still_known(ctx, arrays.to_torch_state_dict(), round_no=cfg["lethe-rectify-rounds"]
                                     + cfg["lethe-restore-rounds"] + 2)
            if check is None:
                break
            checks.append(check)
            if not check["known"] or len(models) > cfg["lethe-verify-passes"]:
                break
            log.warning("[lethe] verify: the restored model still predicts %.3f of the forget set as its label "
                        "(at most %.3f allowed): pass %d from it", check["forget_acc"], check["bound"],
                        len(models) + 1)
            self.round_offset += cfg["lethe-rectify-rounds"] + cfg["lethe-restore-rounds"] + 3
            arrays, more = self.one_pass(dataclasses.replace(ctx, original=ModelState(arrays)))
            details.setdefault("passes", []).append(more)
            more["utility"] = _pass_utility(more["rectify_guard"], start_loss, cfg["lethe-max-retain-rise"])
            if more["utility"]["broken"]:
                log.warning("[lethe] verify: pass %d's restored model has a retained loss of %.3g against %.3g on the "
                            "original: not kept, no further pass", len(models) + 1, more["utility"]["retain_loss"],
                            start_loss)
                break
            models.append(arrays)
        kept = len(models) - 1
        if checks and checks[-1]["known"]:  # every model was checked: pick the one that knows least
            kept = min(range(len(models)), key=lambda i: (checks[i]["forget_acc"], i))
        if checks:
            details["forget_checks"], details["kept_pass"] = checks, kept + 1
            details["kept_still_knows"] = checks[kept]["known"]
            if checks[kept]["known"]:
                log.warning("[lethe] the kept model (pass %d) still predicts %.3f of the forget set as its label "
                            "(at most %.3f allowed): the request is not fully carried out", kept + 1,
                            checks[kept]["forget_acc"], checks[kept]["bound"])
        return UnlearnResult(ModelState(models[kept]), details)

    def one_pass(self, ctx: UnlearnContext) -> tuple[ArrayRecord, dict]:
        """Lethe's Algorithm 1 once, from ``ctx.original``: the restored model and the pass's facts
        (``adapter_final_loss``, ``gamma_bounds``, ``rectify_guard``)."""
        state, plugins, details = self.amplify(ctx)
        state, history, guard = self.rectify_rounds(ctx, state, plugins)
        unchecked = guard.pop("unchecked", None)
        checkpoints = [_backbone(c) for c in guard.pop("checkpoints", [])]
        base = _backbone(state)
        if ctx.cfg["lethe-restore-mode"] == "rectified":
            fallback = _backbone(unchecked[0]) if unchecked is not None else None
            arrays = ArrayRecord(self._restore_with_retries(ctx, base, fallback, guard, checkpoints))
        else:
            arrays = ArrayRecord(base)
            if ctx.cfg["lethe-restore-rounds"]:
                strategy = RoleFedAvg(ctx.fed, "retain", fraction_train=ctx.cfg["fraction-train"],
                                      seed=ctx.cfg["seed"] + 2 + self.round_offset)
                arrays = run_rounds(ctx.fed, strategy, arrays, rounds=ctx.cfg["lethe-restore-rounds"],
                                    config=ConfigRecord({"epochs": ctx.cfg["local-epochs"], "lr": ctx.cfg["lr"]}),
                                    label="lethe restore", method="lethe")
        details["gamma_bounds"] = history
        details["rectify_guard"] = guard
        return arrays, details

    def still_known(self, ctx: UnlearnContext, state: State, round_no: int) -> dict | None:
        """Does the restored ``state`` still know the forget set, as the forget clients measure it?

        It predicts more than ``lethe-verify-forget-acc`` (0.02) of the forget set as its label
        (measured: with the rectification stop's 0.05 here, 22 at 7 clients alpha 0.1, class, kept
        0.041, and 20 continued rounds brought it to 0.110). Client scenario with
        ``lethe-stop-at-reference-client`` (off by default): its share of the forget set predicted
        as the target is above the share of the forget clients' clean test data of the other
        classes predicted as the target (what a model without the backdoor does) by more than a
        one-sided 95 % margin (``VERIFY_Z`` standard errors of the difference of the two shares,
        pooled): the reference is estimated on a few dozen test samples, and a smaller gap is not
        evidence of a backdoor left.
        ``None`` (no check) where neither applies or the task reports no counts (LLM)."""
        cfg = ctx.cfg
        client = self._reference_on(cfg)
        if scenario_setting(cfg, "lethe-stop-forget-acc") >= 1 and not client:
            return None
        counts = self._forget_counts(ctx, state, round_no)
        if counts is None:
            return None
        n_forget, n_test = max(1, counts["forget-n"]), counts["clean-n"]
        acc = counts["forget-correct"] / n_forget
        if client:
            reference = counts["clean-hit"] / n_test if n_test else 0.0
            pooled = (counts["forget-correct"] + counts["clean-hit"]) / (n_forget + n_test)
            spread = 1 / n_forget + (1 / n_test if n_test else 0.0)
            bound = reference + VERIFY_Z * math.sqrt(pooled * (1 - pooled) * spread)
        else:
            reference, bound = None, cfg["lethe-verify-forget-acc"]
        return {"forget_acc": acc, "reference": reference, "bound": bound, "known": acc > bound,
                "forget_n": counts["forget-n"], "test_n": n_test}


RESTORE_FAILED = ("restore_rolled_back_round", "restore_refused_round")


def _pass_utility(guard: dict, start_loss: float | None, max_rise: float) -> dict:
    """Did a pass break utility? Its restored model's retained loss (the retained clients' loss of
    the model restore kept, ``guard["restore_losses"]``) against ``start_loss`` (their loss on the
    original) + ``max_rise``; not judged (``broken`` false) where restore reports no such loss."""
    losses, kept = guard.get("restore_losses"), guard.get("restore_kept")
    if not losses or kept is None or start_loss is None:
        return {"retain_loss": None, "bound": None, "broken": False}
    loss, bound = float(losses[kept]), start_loss + max_rise
    return {"retain_loss": loss, "bound": bound, "broken": not (math.isfinite(loss) and loss <= bound)}


def _losses_before(views) -> dict[int, tuple[int, float]]:
    """``node -> (count, loss-before)``: each retained client's loss of the model it received."""
    return {v["node"]: (int(v["metrics"]["num-examples"]), float(v["metrics"]["loss-before"])) for v in views}


def _best_restored(judged: list[tuple[dict, State]], guard: dict) -> State:
    """Of the models restore went through (the one it started from, then one per step), the one after
    at least ``MIN_RESTORE_STEPS`` restore steps (one where restore applied only one) that the
    retained clients rate best: the lowest count-weighted loss of the received model on their data,
    over the clients that reported on every one of them (ties: the later model). With no step
    applied, the model restore started from.

    Ours. Restore is FedAvg-like on non-IID clients, and its last round is not always its best:
    measured (seed 15, 7 clients alpha 0.1, class), five restore rounds left test accuracy at 0.776
    (retrain 0.948) from a rectified backbone whose retained loss had been fine. The model before any
    restore step is not a candidate: restore also makes the forgetting last (measured, seed 11, 10
    clients alpha 0.5, class: the unrestored backbone had the lowest retained loss, 0.019, and kept,
    it let 20 continued FedAvg rounds bring the class back to 0.404). Nor, for the same reason, is the
    model after a single step where restore took more: measured (seed 11, 10 clients alpha 0.5, client
    backdoor), it had the lowest loss (0.044; the last 0.095, with swings to 0.60 between), and kept,
    20 continued rounds brought the backdoor back to 0.287 (retrain 0.0); with the last kept, 0.000.
    Also seen on seed 61 (10 clients alpha 0.5, class: test accuracy 0.947 -> 0.969 against
    retrain's 0.981; 7 clients alpha 0.1, client: 0.936 -> 0.891 against 0.880). A non-finite report
    is never chosen. ``guard["restore_losses"]`` holds the losses (index 0: the model restore started
    from), ``guard["restore_kept"]`` the chosen index."""
    means = _judged_means(judged)
    first = min(MIN_RESTORE_STEPS, len(means) - 1)  # 0 where no step was applied: the start is the one model
    kept = min(range(first, len(means)), key=lambda i: (means[i], -i))
    guard["restore_losses"], guard["restore_kept"] = means, kept
    if kept != len(judged) - 1:
        log.info("[lethe] restore: of the models after restore step %d or later, the one after step %d has the "
                 "lowest retained loss (%.3g against %.3g for the last): kept", first, kept, means[kept], means[-1])
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


def _short_of_target(judged: list[tuple[dict, State]], target: float | None) -> bool:
    """No model after a restore step (``judged[1:]``) has a retained loss at or below ``target``
    (``None``: no target, never short)."""
    return target is not None and len(judged) > 1 and min(_judged_means(judged)[1:]) > target


def _mean_loss(views, key: str = "loss") -> float:
    """Count-weighted mean of the reported ``key`` (``loss``, or ``loss-before``: the received model's
    loss before training) of ``views`` (nan without any)."""
    counts = [int(v["metrics"]["num-examples"]) for v in views]
    total = sum(counts)
    return sum(n * float(v["metrics"][key]) for n, v in zip(counts, views)) / total if total else math.nan


def _backbone_ok(retain_views, reference: float, max_rise: float) -> bool:
    loss = _mean_loss(retain_views)
    return math.isfinite(loss) and loss <= reference + max_rise


def _interpolate(start: State, end: State, fraction: float) -> State:
    """``start + fraction (end - start)`` on the floating-point tensors (others keep ``start``'s)."""
    return {k: start[k] + fraction * (end[k] - start[k]) if start[k].is_floating_point() else start[k]
            for k in start}


def _backbone(state: State) -> State:
    """``state`` without the temporary adapter's tensors."""
    return {k: v for k, v in state.items() if not k.startswith(PLUGIN_PREFIX)}


class _Judge:
    """``rectify_verdict`` with the retained clients' reference: their losses in the first round,
    i.e. on the model rectification started from, kept per node so that a round in which some
    client did not reply is compared with the same clients' reference. ``relative`` (a verify
    pass): the stop, and with it the overshoot bound, counts from the first round's forget loss,
    since a model that already forgot most of the forget set starts past the absolute stop."""

    def __init__(self, stop_loss: float, max_rise: float, *, relative: bool = False):
        self.stop_loss, self.max_rise, self.relative = stop_loss, max_rise, relative
        self.baseline: dict[int, float] = {}
        self.reference_loss: float | None = None

    def __call__(self, forget_loss: float, retain_views, *, first: bool = False) -> tuple[str, float | None]:
        """``(verdict, retained loss)`` of one round's reports."""
        if first:
            self.baseline = {v["node"]: float(v["metrics"]["loss"]) for v in retain_views}
            if self.relative and math.isfinite(forget_loss):
                self.stop_loss += forget_loss
        now, then = _retain_losses(retain_views, self.baseline)
        if first:
            self.reference_loss = then
        return rectify_verdict(forget_loss, self.stop_loss, now, then, self.max_rise), now
