"""Lethe (paper 001, algorithm 1): amplify -> rectify -> restore, as a Flower strategy.

1. **Amplify** (``lethe-adapter-steps`` > 0): a temporary adapter (``tasks.lethe_adapter``) is
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
   ``lethe-stop-loss`` the phase ends before the retained clients are asked for that round.
3. **Restore** (``lethe-restore-rounds``): the adapter is dropped. ``lethe-restore-mode=fedavg`` is the
   paper's FedAvg on retained clients. ``rectified`` (default, ours) keeps the forget clients in:
   each round both groups train the adapter-free model with the run's ``lr`` / ``local-epochs`` and
   the server applies the retain stream minus its component along the forget stream wherever
   they align (``lethe_math.remove_forget_component``). Measured on digits, plain FedAvg restore
   brought a backdoor that rectification had removed back to 0.2–0.6 within one round; the
   rectified restore kept it at 0 through 20 continued FedAvg rounds.

A forget client that fails during amplify or rectify ends the phase (``RoundFailed`` naming the
phase and round); the original model is never modified, so it stays intact.
"""

from __future__ import annotations

import logging
import math

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp.strategy import FedAvg

from strategies.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod
from strategies.fedavg_rounds import RoleFedAvg, mean_update, run_rounds
from strategies.federation import RoundFailed, RunStopped
from strategies.lethe_math import (apply_update, check_gamma, clip_to_reference, feasible_gamma_range, gamma_bounds,
                                    layer_alignment, layer_gammas, rectify, remove_forget_component)
from tasks.model import PLUGIN_PREFIX
from tasks.plugins import specs_to_json

log = logging.getLogger("fedunlearn")

State = dict[str, torch.Tensor]


def _apply(state: State, update: State, retain_views, buffer_names: list[str], where: str) -> State:
    """Eq. 11 on the parameters; buffers (BatchNorm statistics) take the retain stream's average."""
    state = {**state, **apply_update({k: state[k] for k in update}, update)}
    if buffer_names:
        buffers = mean_update(retain_views, state, buffer_names)
        state.update({k: (state[k] + buffers[k]).to(state[k].dtype) for k in buffer_names})
    if not all(bool(torch.isfinite(v).all()) for v in state.values()):
        raise RunStopped(f"phase 'unlearn' {where}: Lethe's model has non-finite weights; lower lethe-lr or lr")
    return state


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
    """``{"arrays", "metrics"}`` of one role in a reply (a ``forget+retain`` reply holds both)."""
    content = reply.content
    if "arrays" in content:
        return {"arrays": content["arrays"], "metrics": content["metrics"]}
    return {"arrays": content[f"arrays.{role}"], "metrics": content[f"metrics.{role}"]}


class Lethe(FedAvg, UnlearningMethod):
    """Lethe's three phases driven against the federation (FedAvg aggregates the adapters)."""

    name = "lethe"

    def __init__(self):
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, weighted_by_key="num-examples",
                         arrayrecord_key="arrays", configrecord_key="config")

    def _streams(self, ctx: UnlearnContext, state: State, plugins: list[dict], *, round_no: int,
                 stop_loss: float | None = None, **config) -> tuple[list, list | None, float]:
        """One round of both streams: ``(forget views, retain views, forget loss)``.

        The forget clients go first (every one must answer); a client that also holds retained
        data gets one message with role ``forget+retain`` and returns both updates, so it downloads
        the model once. If ``stop_loss`` is reached by the forget clients' reported loss, the
        retained-only clients are not asked and the retain views are ``None``."""
        fed = ctx.fed
        forget_nodes, retain_nodes = fed.nodes_with("n-forget"), fed.nodes_with("n-retain")
        both = set(forget_nodes) & set(retain_nodes)
        arrays = ArrayRecord(state)
        forget_config = {**config, "report-loss-before": stop_loss is not None}
        contents = {role: _train_content(arrays, plugins, role=role, round_no=round_no, **forget_config)
                    for role in ("forget", "forget+retain")}
        messages = [Message(contents["forget+retain" if n in both else "forget"], dst_node_id=n, message_type="train")
                    for n in forget_nodes]
        replies = fed.exchange(messages, round_no=round_no, require_all=True)
        forget_views = [_role_view(r, "forget") for r in replies]
        forget_loss = _forget_loss(forget_views) if stop_loss is not None else math.nan
        if stop_loss is not None and forget_loss >= stop_loss:
            return forget_views, None, forget_loss
        retain_views = [_role_view(r, "retain") for r in replies if r.metadata.src_node_id in both]
        others = [n for n in retain_nodes if n not in both]
        if others:
            content = _train_content(arrays, plugins, role="retain", round_no=round_no, **config)
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
        plugins = [{"kind": "lethe-adapter", "seed": cfg["seed"]}]
        model = ctx.model_factory(plugins)
        model.load_state_dict({**model.state_dict(), **base})
        content = _train_content(ArrayRecord(model.state_dict()), plugins, role="forget", round_no=1,
                                 objective="adapter-ascent", scope="plugins",
                                 **{"max-steps": cfg["lethe-adapter-steps"], "lr": cfg["lethe-adapter-lr"]})
        replies = ctx.fed.broadcast(ctx.fed.nodes_with("n-forget"), "train", content, round_no=1, require_all=True)
        ctx.fed.cost(ctx.fed.phase).rounds += 1
        adapter, _ = self.aggregate_train(1, replies)
        losses = [float(r.content["metrics"]["loss"]) for r in replies]
        return {**model.state_dict(), **adapter.to_torch_state_dict()}, plugins, {"adapter_final_loss": losses}

    def rectify_rounds(self, ctx: UnlearnContext, state: State, plugins: list[dict]) -> tuple[State, list]:
        """Phase 2: ``lethe-rectify-rounds`` rounds of dual-stream rectification of the backbone."""
        cfg, fed = ctx.cfg, ctx.fed
        param_names = [n for n, _ in ctx.model_factory(plugins).named_parameters()
                       if not n.startswith(PLUGIN_PREFIX)]
        buffer_names = [k for k in state if k not in param_names and not k.startswith(PLUGIN_PREFIX)]
        gamma, history = cfg["lethe-gamma"], []
        suffix = "-class" if cfg["scenario"] == "class" else ""  # a class needs larger steps (docs/lethe.md)
        lr, step_clip = cfg[f"lethe-lr{suffix}"], cfg[f"lethe-step-clip{suffix}"]
        for t in range(1, cfg["lethe-rectify-rounds"] + 1):
            local = {"scope": "base", "lr": lr, "epochs": cfg["lethe-epochs"]}
            forget_views, retain_views, forget_loss = self._streams(ctx, state, plugins, round_no=t,
                                                                    stop_loss=cfg["lethe-stop-loss"], **local)
            fed.cost(fed.phase).rounds += 1
            if retain_views is None:
                log.info("[lethe] rectify round %d: the backbone's forget loss %.3g >= lethe-stop-loss %g: "
                         "rectification stops", t, forget_loss, cfg["lethe-stop-loss"])
                history.append({"forget_loss": forget_loss, "stopped": True})
                break
            forget = mean_update(forget_views, state, param_names)
            retain = mean_update(retain_views, state, param_names)
            norms = {name: float(torch.sqrt(sum((v.double() ** 2).sum() for v in stream.values())))
                     for name, stream in (("retain", retain), ("forget", forget))}
            if not all(math.isfinite(v) for v in norms.values()):
                raise RunStopped(f"phase 'unlearn' round {t}: a Lethe update stream is non-finite "
                                 f"(norms {norms}); lower lethe-lr")
            bounds = gamma_bounds(retain, forget)
            gammas = layer_gammas(bounds, gamma, cfg["lethe-gamma-mode"])
            inside = check_gamma(bounds, gammas)
            rectified = rectify(retain, forget, gammas)
            update = clip_to_reference(rectified, retain, step_clip)
            state = _apply(state, update, retain_views, buffer_names, f"rectify round {t}")
            aligned = [k for k, b in bounds.items() if b is not None]
            log.info("[lethe] rectify round %d/%d: |retain| %.3g |forget| %.3g; %d/%d layers aligned (s>0), "
                     "gamma (%s) inside the Prop. IV.1 bounds on %d of them", t, cfg["lethe-rectify-rounds"],
                     norms["retain"], norms["forget"], len(aligned), len(bounds), cfg["lethe-gamma-mode"],
                     sum(inside[k] for k in aligned))
            feasible = feasible_gamma_range(bounds)
            history.append({"forget_loss": forget_loss, "feasible_gamma": list(feasible) if feasible else None,
                            "layers": {k: {"lower": b[0], "upper": b[1], "gamma": gammas[k],
                                           "gamma_inside": inside[k]}
                                       for k, b in bounds.items() if b is not None}})
        return state, history

    def restore_rounds(self, ctx: UnlearnContext, state: State) -> State:
        """Phase 3, ``lethe-restore-mode=rectified`` (our rule): ``lethe-restore-rounds`` rounds in which
        the retained clients train the adapter-free model as in FedAvg (the run's ``lr``,
        ``local-epochs``) and the forget clients do the same on their forget data; the server applies
        the retain stream with its component along the forget stream removed wherever they align
        (``remove_forget_component``), so utility comes back without re-learning the forget data."""
        cfg, fed = ctx.cfg, ctx.fed
        param_names = [n for n, _ in ctx.model_factory([]).named_parameters()]
        buffer_names = [k for k in state if k not in param_names]
        local = {"scope": "all", "lr": cfg["lr"], "epochs": cfg["local-epochs"]}
        for t in range(1, cfg["lethe-restore-rounds"] + 1):
            round_no = cfg["lethe-rectify-rounds"] + t
            forget_views, retain_views, _ = self._streams(ctx, state, [], round_no=round_no, **local)
            fed.cost(fed.phase).rounds += 1
            forget = mean_update(forget_views, state, param_names)
            retain = mean_update(retain_views, state, param_names)
            update = remove_forget_component(retain, forget)
            state = _apply(state, update, retain_views, buffer_names, f"restore round {t}")
            aligned = sum(1 for s in layer_alignment(retain, forget).values() if s > 0)
            log.info("[lethe] restore round %d/%d: forget component removed from %d/%d layers", t,
                     cfg["lethe-restore-rounds"], aligned, len(param_names))
        return state

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        state, plugins, details = self.amplify(ctx)
        state, history = self.rectify_rounds(ctx, state, plugins)
        base = {k: v for k, v in state.items() if not k.startswith(PLUGIN_PREFIX)}
        if ctx.cfg["lethe-restore-mode"] == "rectified":
            arrays = ArrayRecord(self.restore_rounds(ctx, base))
        else:
            arrays = ArrayRecord(base)
            if ctx.cfg["lethe-restore-rounds"]:
                strategy = RoleFedAvg(ctx.fed, "retain", fraction_train=ctx.cfg["fraction-train"],
                                      seed=ctx.cfg["seed"] + 2)
                arrays = run_rounds(ctx.fed, strategy, arrays, rounds=ctx.cfg["lethe-restore-rounds"],
                                    config=ConfigRecord({"epochs": ctx.cfg["local-epochs"], "lr": ctx.cfg["lr"]}),
                                    label="lethe restore")
        details["gamma_bounds"] = history
        return UnlearnResult(ModelState(arrays), details)
