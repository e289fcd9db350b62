"""FedAvg over the clients that hold data of one role (all / retain / forget).

Pretraining (role ``all``), the retrain oracle, continued training and Lethe's restore rounds
(role ``retain``) are all this strategy: Flower's ``FedAvg`` aggregation, with node sampling
restricted to the nodes whose hello counts show data of the role, sampled with the run's seed.
``mean_update`` is the same weighting applied to a list of replies (one-round methods, Lethe's streams).

Every aggregated model is checked before it is used: a non-finite one ends the phase with
:class:`ModelDiverged` naming the phase, the round and the method, so a NaN model is never scored,
cached or trained on silently (continued training catches it and marks the curve instead).
"""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from strategies.common.federation import Federation, RunStopped
from strategies.common.updates import weighted_average
from tasks.validity import nonfinite_tensors

log = logging.getLogger("fedunlearn")


def mean_update(contents: Iterable[RecordDict], start: dict, keys: Iterable[str]) -> dict:
    """Example-count-weighted mean of ``arrays - start`` over ``keys`` for reply contents holding
    ``arrays`` and ``metrics`` (FedAvg's eq. 1 applied to updates): what one-round methods apply and
    what Lethe calls a stream."""
    updates, weights = [], []
    for content in contents:
        state = content["arrays"].to_torch_state_dict()
        updates.append({k: state[k] - start[k] for k in keys})
        weights.append(int(content["metrics"]["num-examples"]))
    return weighted_average(updates, weights)


class ModelDiverged(RunStopped):
    """A phase produced a model with non-finite weights. ``round_no`` is the round that produced it
    and ``last_finite`` the model before that round (what a caller may still report on)."""

    def __init__(self, message: str, *, round_no: int, last_finite: ArrayRecord | None = None):
        super().__init__(message)
        self.round_no, self.last_finite = round_no, last_finite


def require_finite(arrays: ArrayRecord, *, phase: str, round_no: int, method: str,
                   last_finite: ArrayRecord | None = None) -> None:
    """Raise :class:`ModelDiverged` (one line: phase, round, method, first bad tensor) unless every
    floating-point tensor of ``arrays`` is finite."""
    bad = nonfinite_tensors(arrays.to_torch_state_dict())
    if bad:
        raise ModelDiverged(f"phase '{phase}' round {round_no} (method '{method}'): the model has non-finite "
                            f"weights in {len(bad)} tensor(s), first '{bad[0]}'",
                            round_no=round_no, last_finite=last_finite)


ROLE_COUNT_KEY = {"all": "n-all", "retain": "n-retain", "forget": "n-forget"}


class RoleFedAvg(FedAvg):
    """FedAvg whose ``configure_train`` samples only nodes with data of ``role``."""

    def __init__(self, fed: Federation, role: str, *, fraction_train: float, seed: int):
        super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0,
                         weighted_by_key="num-examples", arrayrecord_key="arrays", configrecord_key="config")
        if role not in ROLE_COUNT_KEY:
            raise ValueError(f"role {role!r} is unknown: must be all, retain or forget")
        self.fed, self.role, self.seed = fed, role, seed

    def eligible_nodes(self) -> list[int]:
        return self.fed.nodes_with(ROLE_COUNT_KEY[self.role])

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        eligible = self.eligible_nodes()
        if not eligible:
            raise ValueError(f"no client holds '{self.role}' data: nothing to train on")
        size = max(1, round(self.fraction_train * len(eligible)))
        chosen = sorted(random.Random(self.seed * 100003 + server_round).sample(eligible, size))
        config = ConfigRecord({**dict(config), "role": self.role, "server-round": server_round})
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, chosen, "train")


def scheduled_lr(schedule: str, lr: float, rounds: int) -> Callable[[int], float] | None:
    """The client lr of round ``r`` (1..``rounds``) under ``lr-schedule``; ``None`` for ``constant``.

    ``cosine`` halves the step by mid-phase and ends near zero, so the last rounds move the model
    little: in a strongly non-IID federation (7 clients, Dirichlet 0.1) the last round of a constant
    lr lands anywhere in a band about 0.1 wide of retained accuracy, decided by rounding."""
    if schedule == "constant":
        return None
    if schedule == "cosine":
        return lambda r: lr * 0.5 * (1.0 + math.cos(math.pi * (r - 1) / rounds))
    raise ValueError(f"lr-schedule {schedule!r} is unknown: must be constant or cosine")


def recorded_lr(rounds: dict[int, dict], default: float) -> Callable[[int], float]:
    """``lr(t)``: the clients' lr in round ``t`` of an update history's ``rounds`` (``server_app.history``),
    ``default`` (the run's ``lr``) where it holds none for that round: a method that replays pretraining's
    rounds replays each at the lr it trained at."""
    return lambda t: float(rounds.get(t, {}).get("lr", default))


def with_untrained(aggregated: ArrayRecord, sent: ArrayRecord) -> ArrayRecord:
    """``aggregated`` completed with the tensors of ``sent`` that no client uploaded, in ``sent``'s
    order: a round that trains only part of the model (train scope ``base``: plug-ins frozen) gets
    back only that part, and the frozen rest is the model it sent."""
    if all(key in aggregated for key in sent.keys()):
        return aggregated
    return ArrayRecord({key: aggregated[key] if key in aggregated else sent[key] for key in sent.keys()})


def _mean_loss(replies: list[Message]) -> dict:
    """The example-weighted mean of the clients' reported ``loss`` (what FedAvg's metrics hold)."""
    pairs = [(float(r.content["metrics"]["loss"]), int(r.content["metrics"]["num-examples"])) for r in replies
             if "loss" in r.content["metrics"]]
    total = sum(n for _, n in pairs)
    return {"loss": sum(loss * n for loss, n in pairs) / total} if total else {}


def duration(seconds: float | None) -> str:
    """A time as a person reads it: ``12.3s``, ``3m 05s``, ``1h 02m``; ``—`` where there is none (a
    missing, negative or non-finite estimate)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "—"
    if seconds < 59.95:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    minutes = round(seconds / 60)
    return f"{minutes // 60}h {minutes % 60:02d}m"


def run_rounds(fed: Federation, strategy: RoleFedAvg, arrays: ArrayRecord, *, rounds: int,
               config: ConfigRecord, label: str, method: str,
               after_round: Callable[[int, ArrayRecord], None] | None = None,
               last_round_config: dict | None = None,
               on_replies: Callable[[int, ArrayRecord, list[Message], float | None], None] | None = None,
               aggregate: Callable[[list[Message]], ArrayRecord] | None = None,
               first_round: int = 1, measure_received=None,
               round_lr: Callable[[int], float] | None = None) -> ArrayRecord:
    """``rounds`` rounds of configure -> exchange -> aggregate, numbered from ``first_round`` (a
    method that replays pretraining's later rounds keeps their numbers, hence their seeds); logs
    progress with an ETA. Each round is played once.

    Each aggregated model must be finite (:func:`require_finite`, ``method`` names the run's
    method in the error). ``after_round(r, arrays)`` runs after each round (used to measure
    forgetting per round); ``last_round_config`` adds keys to the last round's config only
    (pretraining asks the clients to keep their last local model); ``on_replies(r, sent, replies, lr)``
    sees each round's global model, the client replies and the lr they trained at (pretraining's
    update history); ``aggregate(replies)``, when given, makes the round's model instead of FedAvg's
    own (a method that trains its own original, e.g. Exact-Fun's quantised FedAvg).
    ``measure_received``, when given, measures each round's model inside the next round
    (``attach(messages, arrays)`` adds to a round's messages, ``collect(replies)`` takes its share
    of the replies and returns the training replies): continued training's KR curve without an
    evaluation round between rounds. ``round_lr(r)``, when given, is round r's client ``lr``
    (:func:`scheduled_lr`).
    """
    started = time.perf_counter()
    cost = fed.cost(fed.phase)
    last = first_round + rounds - 1
    for server_round in range(first_round, last + 1):
        round_config = ConfigRecord({**dict(config), **(last_round_config or {})}) \
            if server_round == last and last_round_config else config
        if round_lr is not None:
            round_config = ConfigRecord({**dict(round_config), "lr": round_lr(server_round)})
        new_arrays, metrics, replies = _play_round(
            fed, strategy, arrays, round_config, server_round, method=method, aggregate=aggregate,
            measure_received=measure_received if server_round > first_round else None)
        cost.rounds += 1
        if on_replies is not None:
            on_replies(server_round, arrays, replies, float(round_config["lr"]) if "lr" in round_config else None)
        arrays = new_arrays
        if after_round is not None:
            after_round(server_round, arrays)
        elapsed = time.perf_counter() - started
        loss = float(metrics["loss"]) if metrics and "loss" in metrics else float("nan")
        done = server_round - first_round + 1
        log.info("[%s] round %d/%d  loss %.4f  elapsed %s  eta %s", label, server_round, last,
                 loss, duration(elapsed), duration(elapsed / done * (rounds - done)))
    return arrays


def _play_round(fed: Federation, strategy: RoleFedAvg, arrays: ArrayRecord, config: ConfigRecord,
                server_round: int, *, method: str, aggregate, measure_received) -> tuple[ArrayRecord, dict, list]:
    """One configure -> exchange -> aggregate from ``arrays``: the finite aggregated model (else
    :class:`ModelDiverged`), its metrics and the training replies."""
    messages = list(strategy.configure_train(server_round, arrays, config, fed.grid))
    if measure_received is not None:
        messages += measure_received.attach(messages, arrays)
    replies = fed.exchange(messages, round_no=server_round)
    if measure_received is not None:
        replies = measure_received.collect(replies)
    if aggregate is None:
        new_arrays, metrics = strategy.aggregate_train(server_round, replies)
    else:
        new_arrays, metrics = aggregate(replies), _mean_loss(replies)
    if new_arrays is None:
        raise RuntimeError(f"phase '{fed.phase}' round {server_round}: aggregation produced no model")
    new_arrays = with_untrained(new_arrays, arrays)
    require_finite(new_arrays, phase=fed.phase, round_no=server_round, method=method, last_finite=arrays)
    return new_arrays, metrics, replies
