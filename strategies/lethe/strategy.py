"""Lethe (the paper's Algorithm 1: amplify -> rectify -> restore) as a Flower strategy.

1. **Amplify** (``lethe.adapter-steps`` = S_φ > 0): a temporary adapter (``strategies.lethe.adapter``)
   is attached between extractor and head; the clients holding forget data train only the adapter by
   gradient ascent on it for S_φ steps (eq. 6); the server averages the adapters by forget counts and
   freezes it. Uploaded once, broadcast once.
2. **Rectify** (``lethe.rectify-rounds`` = T rounds, :mod:`strategies.lethe.rectify`): each round the
   composite model goes to the forget clients (forget stream, eq. 7) and to the retained clients (retain
   stream, eq. 8, weighted by counts), both training only the backbone with ``lethe.lr`` for
   ``lethe.epochs``; per named parameter tensor the server applies eq. 10 with γ = ``lethe.gamma`` and
   eq. 11.
3. **Restore** (``lethe.restore-rounds`` = R): the adapter is dropped; R rounds of FedAvg on the
   retained clients.

The forget stream follows the paper per request: all the leaving client's data (client), its marked
samples (sample), every client's samples of the class (class).

The ``guard.*`` keys (:mod:`strategies.common.guards`, all off by default) add the project's own rules
around these phases: a loss stop and step guards in rectify, a rectified restore with its walk-back,
checks that run more passes, a retry and a narrower stream where a request was not carried out. A
request that a guard judges not carried out is reported as such (``method.carried_out`` false) with
Lethe's own model; Lethe never returns another method's model.

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
from strategies.common.fit import evaluate_plain
from strategies.common.guards import VERIFY_FORGET_ACC
from strategies.lethe.adapter import ADAPTER_KIND
from strategies.lethe.rectify import RectifyPhase
from strategies.lethe.restore import RestorePhase, broken_because, pass_utility
from strategies.lethe.settings import adapter_lr, widens_client_stream
from strategies.lethe.views import State, mean_forget_loss, role_view, train_content, without_adapter

log = logging.getLogger("fedunlearn")


class Lethe(RectifyPhase, RestorePhase, FedAvg, UnlearningMethod):
    """Lethe's three phases driven against the federation (FedAvg aggregates the adapters); rectify and
    the rectified restore live in :mod:`strategies.lethe.rectify` and :mod:`strategies.lethe.restore`."""

    name = "lethe"

    def __init__(self):
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, weighted_by_key="num-examples",
                         arrayrecord_key="arrays", configrecord_key="config")
        self.round_offset = 0  # added to every round number of a pass: a later pass gets its own seeds
        self.attempt_offset = 0  # the round offset of the attempt's first pass (a retry's is not 0)

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
        if cfg["lethe.adapter-steps"] == 0:
            return base, [], {"adapter": "none"}
        plugins = [{"kind": ADAPTER_KIND, "seed": cfg["seed"]}]
        model = ctx.model_factory(plugins)
        model.load_state_dict({**model.state_dict(), **base})
        round_no = 1 + self.round_offset
        content = train_content(ArrayRecord(model.state_dict()), plugins, role="forget", round_no=round_no,
                                 objective="adapter-ascent", scope="plugins", **forget_data(cfg),
                                 **{"max-steps": cfg["lethe.adapter-steps"], "lr": adapter_lr(cfg)})
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
        """One ``evaluate`` message to each forget client with ``state``'s backbone: the summed
        ``forget-correct`` / ``forget-n`` (their forget data predicted as its label); ``None`` on a task
        whose clients report no such counts (the LLM task)."""
        replies = self._evaluate_backbone(ctx, state, "n-forget", round_no, require_all=True)
        metrics = [r.content["metrics"] for r in replies]
        keys = ("forget-correct", "forget-n")
        if not all(k in m for m in metrics for k in keys):
            return None
        return {k: sum(int(m[k]) for m in metrics) for k in keys}

    def _forget_accuracy(self, ctx: UnlearnContext, state: State, round_no: int) -> float:
        """The forget clients' share of their forget data that ``state``'s backbone predicts as its label
        (0 where the task reports no counts: nothing is judged known)."""
        counts = self._forget_counts(ctx, state, round_no)
        return 0.0 if counts is None else counts["forget-correct"] / max(1, counts["forget-n"])

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        """Lethe from ``ctx.original``: :meth:`attempt_with_retry`. ``method.carried_out`` says whether a
        guard's check found the request carried out (absent where nothing checked it)."""
        result = self.attempt_with_retry(ctx, offset=0)
        done = carried_out(result.details)
        if done is not None:
            result.details["carried_out"] = done
        if done is False:
            log.warning("[lethe] the request was NOT carried out: the reported model is Lethe's own, flagged "
                        "(method.carried_out false)")
        return result

    def attempt_with_retry(self, ctx: UnlearnContext, offset: int) -> UnlearnResult:
        """:meth:`attempt` from round offset ``offset``; with ``guard.retry-walk-back`` above
        ``guard.walk-back``, where the attempt did not carry the request out, one more attempt from the
        original with the walk-back bound at that value, kept where it carries the request out or, failing
        that, where its kept model predicts less of the forget set as its label (``method.retry``). The
        walk-back undoes rectification steps whose backbone the retained clients rate worse than its bound;
        an original that fits its retained data very tightly can have every forgetting step undone, and
        the retry loosens only that bound (restore's own bound stays)."""
        cfg = ctx.cfg
        first = self.attempt(ctx, offset=offset)
        retry_rise = cfg["guard.retry-walk-back"]
        if carried_out(first.details) is not False or retry_rise <= cfg["guard.walk-back"]:
            return first
        log.warning("[lethe] the request was not carried out: one more attempt from the original with "
                    "guard.walk-back %g (guard.retry-walk-back)", retry_rise)
        looser = _with_setting(ctx, "guard.walk-back", retry_rise)
        retry = self.attempt(looser, offset=self.round_offset + pass_rounds(cfg))
        return _keep_better(first, retry, retry_rise)

    def attempt(self, ctx: UnlearnContext, offset: int) -> UnlearnResult:
        """Amplify, rectify and restore (:meth:`one_pass`); then, with ``guard.verify-passes``, while the
        forget clients find the restored model still knows the forget set (:meth:`still_known`), at most
        that many more passes, each from the model the last one left.

        The kept model is the last pass's when its check passes, else the pass whose model predicts the
        least of the forget set as its label (ties: the earlier). A later pass whose restored model breaks
        ``guard.retain-rise`` (:func:`strategies.lethe.restore.pass_utility`) is never
        kept and ends the passes. Where pass 1 breaks them, its model is reported with
        ``method.kept_pass`` 1, ``method.utility`` saying why, and the request as not carried out: a model
        that lost its utility is a failed request the operator must see. ``method.forget_checks`` holds
        each check, ``method.passes`` the later passes' records, ``method.kept_still_knows`` whether the
        kept model fails its check."""
        cfg = ctx.cfg
        self.round_offset = self.attempt_offset = offset
        arrays, details = self.one_pass(ctx)
        start_loss = details["rectify_guard"].get("start_retain_loss")  # the retained clients' loss of the original
        retain_rise = cfg["guard.retain-rise"]
        details["utility"] = pass_utility(details["rectify_guard"], start_loss, retain_rise)
        if details["utility"]["broken"]:
            log.warning("[lethe] pass 1's restored model broke utility (%s): the request is not carried out",
                        broken_because(details["utility"], start_loss))
            details["kept_pass"] = 1
            return UnlearnResult(ModelState(arrays), details)
        models, checks = [arrays], []
        while cfg["guard.verify-passes"]:
            # numbered after restore's last round and the reports on its model
            check = self.still_known(ctx, arrays.to_torch_state_dict(), round_no=cfg["lethe.rectify-rounds"]
                                     + cfg["lethe.restore-rounds"] + 2)
            if check is None:
                break
            checks.append(check)
            if not check["known"] or len(models) > cfg["guard.verify-passes"]:
                break
            log.warning("[lethe] verify: the restored model still predicts %.3f of the forget set as its label "
                        "(at most %.3f allowed): pass %d from it", check["forget_acc"], check["bound"],
                        len(models) + 1)
            self.round_offset += pass_rounds(cfg)
            arrays, more = self.one_pass(dataclasses.replace(ctx, original=ModelState(arrays)), start_loss=start_loss)
            details.setdefault("passes", []).append(more)
            more["utility"] = pass_utility(more["rectify_guard"], start_loss, retain_rise)
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
        if ctx.cfg["guard.rectified-restore"]:
            fallback = without_adapter(unchecked[0]) if unchecked is not None else None
            start_loss = guard.get("start_retain_loss") if start_loss is None else start_loss
            arrays = ArrayRecord(self.restore_within_bound(ctx, base, fallback, guard, checkpoints, start_loss))
        else:  # the paper: R rounds of FedAvg on the retained clients
            arrays = ArrayRecord(base)
            if ctx.cfg["lethe.restore-rounds"]:
                strategy = RoleFedAvg(ctx.fed, "retain", fraction_train=ctx.cfg["fraction-train"],
                                      seed=ctx.cfg["seed"] + 2 + self.round_offset)
                arrays = run_rounds(ctx.fed, strategy, arrays, rounds=ctx.cfg["lethe.restore-rounds"],
                                    config=ConfigRecord({"epochs": ctx.cfg["local-epochs"], "lr": ctx.cfg["lr"]}),
                                    label="lethe restore", method="lethe")
        details["gamma_bounds"] = history
        details["rectify_guard"] = guard
        return arrays, details

    def still_known(self, ctx: UnlearnContext, state: State, round_no: int) -> dict | None:
        """Does the restored ``state`` still know the forget set, as the forget clients measure it? It
        predicts more than ``VERIFY_FORGET_ACC`` of the forget set as its label. ``None`` (no check)
        where the task reports no counts (LLM)."""
        counts = self._forget_counts(ctx, state, round_no)
        if counts is None:
            return None
        acc = counts["forget-correct"] / max(1, counts["forget-n"])
        return {"forget_acc": acc, "bound": VERIFY_FORGET_ACC, "known": acc > VERIFY_FORGET_ACC,
                "forget_n": counts["forget-n"]}


def _with_setting(ctx: UnlearnContext, key: str, value) -> UnlearnContext:
    """``ctx`` with run-config ``key`` set to ``value`` (a retry's or a fallback's config)."""
    return dataclasses.replace(ctx, cfg=ctx.cfg.with_values({key: value}))


def _keep_better(first: UnlearnResult, retry: UnlearnResult, retry_rise: float) -> UnlearnResult:
    """Of an attempt that left the request undone (``first``) and the retry from the original with
    ``guard.walk-back`` at ``retry_rise``: ``retry`` where it carries the request out or its kept model
    predicts less of the forget set as its label (:func:`known_share`), else ``first``. The kept one's
    ``details["retry"]`` holds ``backbone_rise``, ``kept`` (whether the retry was kept) and ``other``
    (the other's verdict)."""
    done, shares = carried_out(retry.details) is True, (known_share(retry.details), known_share(first.details))
    kept = done or shares[0] < shares[1]
    log.warning("[lethe] again with guard.walk-back %g: the request %s (the kept model predicts %.3f of the forget "
                "set as its label, the first attempt's %.3f); the %s attempt is kept", retry_rise,
                "is carried out" if done else "is still not carried out", *shares, "second" if kept else "first")
    chosen, other = (retry, first) if kept else (first, retry)
    chosen.details["retry"] = {"backbone_rise": retry_rise, "kept": kept,
                               "other": {k: v for k, v in other.details.items()
                                         if k in ("kept_pass", "kept_still_knows", "utility")}}
    return chosen


def forget_data(cfg) -> dict:
    """The forget stream's train-message config: ``forget-all-data`` where the stream is all the leaving
    client's training data (:func:`strategies.lethe.settings.widens_client_stream`), else nothing. The
    paper builds the client-level forget stream from all the unlearning client's data; a backdoor
    client here also trained a clean copy of each marked sample, and that copy is its data too."""
    return {"forget-all-data": True} if widens_client_stream(cfg) else {}


def pass_rounds(cfg) -> int:
    """The round numbers one pass takes: its rectify and restore rounds and three more (amplify and the
    reports on its models), so that the next pass, or a retry, draws seeds of its own."""
    return cfg["lethe.rectify-rounds"] + cfg["lethe.restore-rounds"] + 3


def known_share(details: dict) -> float:
    """The share of the forget set an attempt's kept model still predicts as its label, as the forget
    clients' check measured it; ``inf`` where nothing was checked or the kept pass broke utility."""
    checks, kept = details.get("forget_checks"), details.get("kept_pass")
    if not checks or not kept or details.get("utility", {}).get("broken"):
        return math.inf
    return checks[kept - 1]["forget_acc"]


def carried_out(details: dict) -> bool | None:
    """Did an attempt carry the request out, as a guard judged it? False where its kept pass broke
    utility or its kept model still knows the forget set; True where the forget clients' check passed;
    None where nothing judged it (no guard checked: the paper's Lethe, or the LLM task)."""
    if details.get("utility", {}).get("broken"):
        return False
    if "kept_still_knows" not in details:
        return None
    return not details["kept_still_knows"]
