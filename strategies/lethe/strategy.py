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

0. **Exact fallback** (ours, ``lethe-exact-share``, :mod:`strategies.lethe.exact`), before any of it:
   a request that removes most of a class's training samples but leaves some gets exact retraining
   on the retained clients, not a rectified model.

A forget client that fails during amplify or rectify ends the phase (``RoundFailed`` naming the
phase and round); the original model is never modified, so it stays intact.
"""

from __future__ import annotations

import dataclasses
import logging
import math

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp.strategy import FedAvg

from strategies.common.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod
from strategies.common.fedavg_rounds import RoleFedAvg, run_rounds
from strategies.common.federation import RoundFailed
from strategies.common.fit import evaluate_plain, fit_share, retained_counts
from strategies.lethe.adapter import ADAPTER_KIND
from strategies.lethe.exact import mostly_removed_classes
from strategies.lethe.rectify import RectifyPhase
from strategies.lethe.restore import RestorePhase, broken_because, pass_utility
from strategies.lethe.settings import scenario_key, scenario_setting, widens_client_stream
from strategies.lethe.views import State, mean_forget_loss, role_view, train_content, without_adapter
from tasks.config import Config

log = logging.getLogger("fedunlearn")

VERIFY_Z = 1.645  # one-sided 95 % normal quantile: the client check's margin over the clean-data reference


class Lethe(RectifyPhase, RestorePhase, FedAvg, UnlearningMethod):
    """Lethe's three phases driven against the federation (FedAvg aggregates the adapters); rectify and
    restore live in :mod:`strategies.lethe.rectify` and :mod:`strategies.lethe.restore`."""

    name = "lethe"

    def __init__(self):
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, weighted_by_key="num-examples",
                         arrayrecord_key="arrays", configrecord_key="config")
        self.round_offset = 0  # added to every round number of a pass: a later pass gets its own seeds
        self.attempt_offset = 0  # the round offset of the attempt's first pass (the retry's is not 0)
        self.start_fit: dict[int, tuple[int, int]] | None = None  # the original's retained counts (retained_fit)

    @property
    def later_pass(self) -> bool:
        """A verify pass (see :meth:`attempt`): its loss stop counts from its start."""
        return self.round_offset > self.attempt_offset

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
        forget_config = {**config, **forget_data(ctx.cfg), "report-loss-before": ",".join(reported),
                         "loss-before-bypass": ADAPTER_KIND}
        contents = {role: train_content(arrays, plugins, role=role, round_no=round_no, **forget_config)
                    for role in ("forget", "forget+retain")}
        messages = [Message(contents["forget+retain" if n in both else "forget"], dst_node_id=n, message_type="train")
                    for n in forget_nodes]
        replies = fed.exchange(messages, round_no=round_no, require_all=True)
        forget_views = [role_view(r, "forget") for r in replies]
        forget_loss = mean_forget_loss(forget_views) if stop_loss is not None else math.nan
        retain_views = [role_view(r, "retain") for r in replies if r.metadata.src_node_id in both]
        others = [n for n in retain_nodes if n not in both]
        if others:
            retain_config = {**config, "loss-before-bypass": ADAPTER_KIND} if asked else config
            content = train_content(arrays, plugins, role="retain", round_no=round_no, **retain_config)
            retain_views += [role_view(r, "retain") for r in fed.broadcast(others, "train", content, round_no=round_no)]
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
        content = train_content(ArrayRecord(model.state_dict()), plugins, role="forget", round_no=round_no,
                                 objective="adapter-ascent", scope="plugins", **forget_data(cfg),
                                 **{"max-steps": cfg["lethe-adapter-steps"], "lr": cfg["lethe-adapter-lr"]})
        replies = ctx.fed.broadcast(ctx.fed.nodes_with("n-forget"), "train", content, round_no=round_no,
                                    require_all=True)
        ctx.fed.cost(ctx.fed.phase).rounds += 1
        adapter, _ = self.aggregate_train(1, replies)
        losses = [float(r.content["metrics"]["loss"]) for r in replies]
        return {**model.state_dict(), **adapter.to_torch_state_dict()}, plugins, {"adapter_final_loss": losses}

    def _evaluate_backbone(self, ctx: UnlearnContext, state: State, count_key: str, round_no: int,
                           require_all: bool = False) -> list[Message]:
        """One ``evaluate`` message with ``state``'s backbone (adapter removed) to each node holding data
        counted by ``count_key``; their replies."""
        return evaluate_plain(ctx.fed, count_key, ArrayRecord(without_adapter(state)), round_no + self.round_offset,
                              require_all=require_all)

    def _forget_counts(self, ctx: UnlearnContext, state: State, round_no: int) -> dict[str, int] | None:
        """One ``evaluate`` message to each forget client with ``state``'s backbone: the summed counts
        ``forget-correct`` / ``forget-n`` (their forget data predicted as its label) and
        ``clean-hit`` / ``clean-n`` (their clean local test data whose true label is not
        ``backdoor-target``, predicted as it); ``None`` on a task whose clients report no such counts
        (the LLM task)."""
        replies = self._evaluate_backbone(ctx, state, "n-forget", round_no, require_all=True)
        metrics = [r.content["metrics"] for r in replies]
        keys = ("forget-correct", "forget-n", "pred-target-n", "pred-target-correct", "test-n", "test-target-n")
        if not all(k in m for m in metrics for k in keys):
            return None
        total = {k: sum(int(m[k]) for m in metrics) for k in keys}
        return {"forget-correct": total["forget-correct"], "forget-n": total["forget-n"],
                "clean-hit": total["pred-target-n"] - total["pred-target-correct"],
                "clean-n": total["test-n"] - total["test-target-n"]}

    def _retained_counts(self, ctx: UnlearnContext, state: State, round_no: int) -> dict[int, tuple[int, int]] | None:
        """:func:`strategies.common.fit.retained_counts` of ``state``'s backbone (adapter removed)."""
        return retained_counts(ctx.fed, ArrayRecord(without_adapter(state)), round_no + self.round_offset)

    def retained_fit(self, ctx: UnlearnContext, state: State) -> dict | None:
        """``{"original", "restored"}``: the share of the retained clients' training data whose label the
        run's original (:attr:`start_fit`, read once when :meth:`unlearn` began) and ``state`` predict, over the
        clients that reported on both; ``None`` where not measured (no original counts, a task without
        them, no common client). :func:`strategies.lethe.restore.pass_utility` holds a pass to it."""
        if not self.start_fit:
            return None
        now = self._retained_counts(ctx, state, round_no=pass_rounds(ctx.cfg) - 1)
        common = sorted(set(now or {}) & set(self.start_fit))
        original = fit_share(self.start_fit, common)
        return None if original is None else {"original": original, "restored": fit_share(now, common)}

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

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        """:meth:`attempt_with_retry`; where it left the request undone (:func:`carried_out` is false,
        its retry included) with the client scenario's forget stream widened to all the leaving
        client's data (:func:`forget_data`), Lethe runs once more from the original with the request's
        forget set as the stream (``lethe-client-forget-stream=forget-set``, its own bounds and retry,
        its own round seeds), kept where it carries the request out or, failing that, where its kept
        model predicts less of the forget set as its label (``method.stream_fallback``: the stream,
        whether the fallback was kept, and the other's verdict).

        Ours. The whole-data stream subtracts everything the leaving client taught. Where that client
        nearly owns several classes, the retained clients' loss of every rectified backbone passes its
        bound and the walk-back returns towards the original pass after pass: measured (seed 195, 7
        clients alpha 0.1, client; the client holds 92 % of class 2 and 99 % of classes 6 and 8), four
        passes left 1.000, 0.965, 0.727 and 0.580 of the triggered samples on the target, and the
        kept model read U-KR 0.580 against retrain's 0.021. With the fallback the forget set's own
        retry carried it out: U-KR 0.007, test accuracy 0.969 against retrain's 0.819 (that stream
        keeps the client's clean classes, as it does everywhere; docs/lethe-log.md, "A request the
        whole-data stream leaves undone"). A backdoor left in place is the failure an operator cannot
        accept; a model that knows the client's clean classes better than retrain is what the former
        stream always gave. A request the whole-data stream carries out never runs the fallback, so
        its results are that stream's. Since then the whole-data stream's own retry loosens its
        walk-back to 4 nats (:meth:`attempt_with_retry`); it carries 195 out (test accuracy 0.758
        against 0.819) and 205 (7 clients alpha 0.1, client; the client holds all of class 6 and 82 %
        of class 7: 0.839 against retrain's 0.842, where the fallback read 0.944), so the fallback is
        left for a request that both whole-data attempts leave undone (docs/lethe-log.md, "The
        whole-data stream's retry").

        Before all of it, the exact fallback (:mod:`strategies.lethe.exact`): where the request removes
        at least ``lethe-exact-share`` of some class's training samples and the retained clients hold
        the rest, the result is the run's retrain model, at retrain's cost, with the classes and
        shares in ``method.exact_fallback``."""
        cfg = ctx.cfg
        share = cfg["lethe-exact-share"]
        classes = mostly_removed_classes(ctx.fed, share) if share < 1 else {}
        if classes:
            named = ", ".join(f"{part:.2f} of class {label}" for label, part in classes.items())
            log.warning("[lethe] the request removes %s and the retained clients hold the rest: rectification cannot "
                        "match exact unlearning on such a class, so the result is exact retraining on the retained "
                        "clients (lethe-exact-share=%g; 1 = never)", named, share)
            fallback = {"share": share, "classes": {str(label): part for label, part in classes.items()}}
            return UnlearnResult(ctx.retrain(), {"exact_fallback": fallback}, built="retrain")
        self.start_fit = None  # every attempt runs from this original: its retained counts are read once
        if cfg["lethe-max-fit-drop"] < 1 and cfg["lethe-restore-mode"] == "rectified" and cfg.num_classes:
            self.start_fit = self._retained_counts(ctx, ctx.original.arrays.to_torch_state_dict(), round_no=0)
        first = self.attempt_with_retry(ctx, offset=0)
        if carried_out(first.details) is not False or not widens_client_stream(cfg):
            return first
        log.warning("[lethe] the request was not carried out with all the leaving client's data as the forget "
                    "stream: again from the original with its forget set as the stream")
        narrower = _with_setting(ctx, "lethe-client-forget-stream", "forget-set")
        fallback = self.attempt_with_retry(narrower, offset=self.round_offset + pass_rounds(cfg))
        return _keep_better(first, fallback, "stream_fallback", {"stream": "forget-set"},
                            "the forget set as the stream")

    def attempt_with_retry(self, ctx: UnlearnContext, offset: int) -> UnlearnResult:
        """:meth:`attempt` from round offset ``offset``; where it did not carry the request out
        (:func:`carried_out` is false: the original was returned, or the kept model still knows the
        forget set) and ``lethe-retry-backbone-rise`` is above the walk-back bound
        ``lethe-max-backbone-rise`` (each read as its ``-client`` twin where :func:`forget_data` widens
        the stream), one more attempt from the original with that bound at this value, kept where it
        carries the request out or, failing that, where its kept model predicts less of the forget set
        as its label (:func:`known_share`) than the first attempt's (``method.retry``: the bound,
        whether the retry was kept, and the other attempt's verdict).

        Ours. The walk-back (:meth:`RestorePhase.restore_rounds`) undoes rectification steps whose
        adapter-free backbone the retained clients rate more than ``lethe-max-backbone-rise`` worse than
        the model rectification started from. An original that fits its retained data very tightly
        (digits with one local epoch a round: 0.002-0.033 nats) reads 0.6-5.4 nats after any step that
        forgets, and the walk-back undid every pass: measured, seeds 178 (7 clients alpha 0.1, client)
        and 179 (class) kept U-KR 0.972 and 0.818. As the bound for every request, 2 nats carried both
        out but left one of 48 cells undone that 0.5 carried out (176, 7 clients alpha 0.1, class: U-KR
        0.939); as a retry it ran in exactly three of the 48 and carried each out: 178 client U-KR 0.000,
        test accuracy 0.972 against retrain's 0.964; 179 class 0.000, 0.978 against 0.981; 174 (10
        clients alpha 0.5, sample) 0.000, 0.978 against 0.972 (docs/lethe-log.md, "Lethe's bounds on
        recipe B"). Restore's own bound (``lethe-max-retain-rise``) is the same in the retry: it never
        keeps a model with less utility than the first attempt may. Where neither attempt carries the
        request out, the one that knows less is kept, as between the passes of one attempt: measured
        (seed 180, 10 clients alpha 0.5, class), the first kept 0.549 of the class, the retry 0.070.
        The whole-data stream's walk-back bound is already 2 nats, so its retry loosens it to 4
        (``lethe-retry-backbone-rise-client``): measured where that stream left a request undone (seeds
        195 and 205, 7 clients alpha 0.1, client), the retry carried both out with that stream (U-KR
        0.014 and 0.007), and the forget-set fallback of :meth:`unlearn` did not run."""
        cfg = ctx.cfg
        first = self.attempt(ctx, offset=offset)
        retry_key = scenario_key(cfg, "lethe-retry-backbone-rise")
        bound_key = scenario_key(cfg, "lethe-max-backbone-rise")
        retry_rise = cfg[retry_key]
        if carried_out(first.details) is not False or retry_rise <= cfg[bound_key]:
            return first
        log.warning("[lethe] the request was not carried out: one more attempt from the original with "
                    "%s %g (%s)", bound_key, retry_rise, retry_key)
        looser = _with_setting(ctx, bound_key, retry_rise)
        retry = self.attempt(looser, offset=self.round_offset + pass_rounds(cfg))
        return _keep_better(first, retry, "retry", {"backbone_rise": retry_rise}, f"{bound_key} {retry_rise:g}")

    def attempt(self, ctx: UnlearnContext, offset: int) -> UnlearnResult:
        """Amplify, rectify and restore (:meth:`one_pass`); then, while the forget clients find the
        restored model still knows the forget set (:meth:`still_known`), at most
        ``lethe-verify-passes`` more passes, each from the model the last one left.

        Ours (the paper runs one pass). Measured off the tuned seeds, the guards of one pass can end it short of
        forgetting: a walk-back to a checkpoint that still classifies part of the class (seed 14, 10 clients
        alpha 0.5, class: U-KR 0.216), restore undoing part of the forgetting (seed 19, 10 clients, client:
        0.408 against retrain's 0.014). The kept model is the last pass's when its check passes, else the pass
        whose model predicts the least of the forget set as its label (ties: the earlier). A later pass whose
        restored model the retained clients rate more than ``lethe-max-retain-rise`` nats worse than the
        original (:func:`strategies.lethe.restore.pass_utility`) is never kept and ends the passes: measured
        (seed 26, 7 clients alpha 0.1, class), pass 2 forgot the class but left a retained loss of 2.33 against
        the original's 0.016 (test accuracy 0.611 against retrain's 0.966). Up to three more passes by default:
        a second pass can still leave the forget set partly known (seed 4, 7 clients alpha 0.1, class: 0.812
        after two passes, 0.000 after three), and a pass only runs where the check before it failed, so a run
        whose first or second check passes gives the model it gave with one pass allowed (docs/lethe-log.md, "Up
        to three verify passes"). ``method.forget_checks`` holds each check, ``method.passes`` the later passes'
        ``gamma_bounds``, ``rectify_guard`` and ``utility``, ``method.kept_pass`` the kept one, and
        ``method.kept_still_knows`` whether the kept model fails its check (then a warning says so: seed 11, 7
        clients alpha 0.1, client, on a later machine kept a pass 1 that still predicted 1.000 of the forget set
        as the target, pass 2 having broken utility). Pass 1 is held to the same bounds (``method.utility``;
        on a task with classes also the retained data's fit, ``lethe-max-fit-drop``, against the original's
        counts read once when :meth:`unlearn` begins): where even its restores at a halved lr
        (:meth:`RestorePhase.restore_within_bound`) keep a model past them, the original model is returned
        (``method.kept_pass`` 0), no further pass runs, and a warning says the request was not carried out:
        a model that still holds the forget data is a failed request the operator sees, a model that lost
        its utility would be a quiet one."""
        cfg = ctx.cfg
        self.round_offset = self.attempt_offset = offset
        arrays, details = self.one_pass(ctx)
        start_loss = details["rectify_guard"].get("start_retain_loss")  # the retained clients' loss of the original
        retain_rise, fit_drop = scenario_setting(cfg, "lethe-max-retain-rise"), cfg["lethe-max-fit-drop"]
        details["utility"] = pass_utility(details["rectify_guard"], start_loss, retain_rise, fit_drop)
        if details["utility"]["broken"]:
            log.warning("[lethe] pass 1's restored model broke utility (%s): the original model is kept and the "
                        "request is not carried out", broken_because(details["utility"], start_loss))
            details["kept_pass"] = 0
            return UnlearnResult(ctx.original, details)
        models, checks = [arrays], []
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
            self.round_offset += pass_rounds(cfg)
            arrays, more = self.one_pass(dataclasses.replace(ctx, original=ModelState(arrays)), start_loss=start_loss)
            details.setdefault("passes", []).append(more)
            more["utility"] = pass_utility(more["rectify_guard"], start_loss, retain_rise, fit_drop)
            if more["utility"]["broken"]:
                log.warning("[lethe] verify: pass %d's restored model broke utility (%s): not kept, no further pass",
                            len(models) + 1, broken_because(more["utility"], start_loss))
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

    def one_pass(self, ctx: UnlearnContext, start_loss: float | None = None) -> tuple[ArrayRecord, dict]:
        """Lethe's Algorithm 1 once, from ``ctx.original``: the restored model and the pass's facts
        (``adapter_final_loss``, ``gamma_bounds``, ``rectify_guard``). ``start_loss``: the retained
        clients' loss of the run's original, which the rectified restore's model is held to (a later
        pass starts from another model; pass 1 reads it in its own first rectification round)."""
        state, plugins, details = self.amplify(ctx)
        state, history, guard = self.rectify_rounds(ctx, state, plugins)
        unchecked = guard.pop("unchecked", None)
        checkpoints = [without_adapter(c) for c in guard.pop("checkpoints", [])]
        base = without_adapter(state)
        if ctx.cfg["lethe-restore-mode"] == "rectified":
            fallback = without_adapter(unchecked[0]) if unchecked is not None else None
            start_loss = guard.get("start_retain_loss") if start_loss is None else start_loss
            arrays = ArrayRecord(self.restore_within_bound(ctx, base, fallback, guard, checkpoints, start_loss))
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


def _with_setting(ctx: UnlearnContext, key: str, value) -> UnlearnContext:
    """``ctx`` with run-config ``key`` set to ``value`` (a retry's or a fallback's config)."""
    return dataclasses.replace(ctx, cfg=Config({**ctx.cfg.as_dict(), key: value}, ctx.cfg.presets))


def _keep_better(first: UnlearnResult, second: UnlearnResult, key: str, record: dict, label: str) -> UnlearnResult:
    """Of an attempt that left the request undone (``first``) and one more run from the original
    (``second``): ``second`` where it carries the request out or its kept model predicts less of the
    forget set as its label (:func:`known_share`), else ``first``. The kept one's ``details[key]`` is
    ``record`` with ``kept`` (whether ``second`` was kept) and ``other`` (the other's verdict)."""
    done, shares = carried_out(second.details) is True, (known_share(second.details), known_share(first.details))
    kept = done or shares[0] < shares[1]
    log.warning("[lethe] again with %s: the request %s (the kept model predicts %.3f of the forget set as its "
                "label, the first attempt's %.3f); the %s attempt is kept", label,
                "is carried out" if done else "is still not carried out", *shares, "second" if kept else "first")
    chosen, other = (second, first) if kept else (first, second)
    chosen.details[key] = {**record, "kept": kept, "other": {k: v for k, v in other.details.items()
                                                              if k in ("kept_pass", "kept_still_knows", "utility")}}
    return chosen


def forget_data(cfg) -> dict:
    """The forget stream's train-message config: ``forget-all-data`` where the stream is all the leaving
    client's training data (:func:`strategies.lethe.settings.widens_client_stream`), else nothing.

    The Lethe paper builds the client-level forget stream from all data of the unlearning client. Our
    backdoor client also trained a clean copy of each sample (so that the original stays usable), and
    retrain drops those too: where it held most of a class, retrain loses the class, and a forget stream
    of the triggered samples alone kept it. Measured on seeds 176-184 (7 clients alpha 0.1, client; test
    accuracy within 0.03 of retrain's): 3 of 9 with the triggered samples, 7 of 9 with all the client's
    data, the client scenario's bounds at 2 nats and 30 extra restore rounds (10 clients alpha 0.5: 9 of
    9 either way); with the bounds at 0.5 it left the backdoor in two cells (docs/lethe-log.md, "The
    leaving client's whole data as Lethe's forget stream")."""
    return {"forget-all-data": True} if widens_client_stream(cfg) else {}


def pass_rounds(cfg) -> int:
    """The round numbers one pass takes: its rectify and restore rounds and three more (amplify and the
    reports on its models), so that the next pass, or a retry, draws seeds of its own."""
    return cfg["lethe-rectify-rounds"] + cfg["lethe-restore-rounds"] + 3


def known_share(details: dict) -> float:
    """The share of the forget set an attempt's kept model still predicts as its label, as the forget
    clients' check measured it; ``inf`` where the attempt returned the original (pass 1 broke the
    retained bound) or nothing was checked."""
    checks, kept = details.get("forget_checks"), details.get("kept_pass")
    if not checks or not kept:
        return math.inf
    return checks[kept - 1]["forget_acc"]


def carried_out(details: dict) -> bool | None:
    """Did an attempt carry the request out? False where it returned the original (pass 1 broke the
    retained bound) or its kept model still knows the forget set; True where the forget clients'
    check passed; None where nothing judged it (no check: the LLM task, or the checks off)."""
    if details.get("kept_pass") == 0:
        return False
    if "kept_still_knows" not in details:
        return None
    return not details["kept_still_knows"]
