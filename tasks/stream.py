"""A stream of deletion requests (run-config ``requests``): parsing, checks and each request's config.

``requests='class:3; client:4; sample:2'`` lists requests in the order they arrive, separated by
``;``; each is ``scenario`` or ``scenario:id`` — the class for ``class``, the client for ``client``
and ``sample``. Without an id a request takes ``forget-class`` / ``forget-client`` (-1: the largest
client). Empty (the default): the one request ``scenario`` describes, and no stream.

The federation's data is set up once, before the original is trained: every client that a
``client`` request names is poisoned (``poison``) and every ``sample`` request's samples carry the
trigger from the start, exactly as the single-request scenarios set them up, because a request can
only remove what the model learnt. Request ``k`` then sees (``tasks.requests.apply_stream``):

- forget set: what request ``k`` names, as it was trained (poisoned where poisoned), less what an
  earlier request already removed;
- retained data: everything no request up to ``k`` has removed;
- the clients' view before any request (index 0, pretraining): the whole federation as set up.

Requests that plant the backdoor trigger (``sample``, ``client`` with ``poison='backdoor'``) share
one trigger and one target label, so the triggered test could not tell two of them apart: a stream
holds at most one. A class or a client is named at most once.

Messages carry the index of the request they belong to (``Federation.request_index``); a client
builds its view of that request (``request_config``).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config import SCENARIOS, Config, ConfigError

#: the Config entry (not a run-config key) holding the index of the request a view belongs to
INDEX_KEY = "stream-index"
#: the message record (a ConfigRecord ``{"request": index}``) naming the request a message is about
REQUEST_RECORD = "stream"


@dataclass(frozen=True)
class Request:
    """One deletion request: ``scenario`` and ``target`` (class or client id; -1 = the largest client)."""

    scenario: str
    target: int

    def as_dict(self) -> dict:
        return {"scenario": self.scenario, "target": self.target}

    def label(self) -> str:
        return f"{self.scenario}:{self.target}"


def _fail(text: str, problem: str) -> ConfigError:
    return ConfigError(f"run-config 'requests'={text!r}: {problem}")


def parse_requests(cfg: Config) -> list[Request]:
    """The requests of ``cfg`` in order: the parsed ``requests`` key, or the one request that
    ``scenario`` (+ ``forget-class`` / ``forget-client``) describes when it is empty."""
    text = cfg["requests"]
    if not text.strip():
        return [Request(cfg["scenario"], cfg["forget-class"] if cfg["scenario"] == "class" else cfg["forget-client"])]
    found = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            raise _fail(text, "an empty request (two ';' in a row or a trailing ';'): each is 'scenario' or "
                              "'scenario:id'")
        scenario, _, target = (s.strip() for s in part.partition(":"))
        if scenario not in SCENARIOS:
            raise _fail(text, f"unknown scenario {scenario!r}: each request is one of {', '.join(SCENARIOS)}, "
                              "optionally ':id'")
        if not target:
            found.append(Request(scenario, cfg["forget-class"] if scenario == "class" else cfg["forget-client"]))
            continue
        try:
            value = int(target)
        except ValueError:
            raise _fail(text, f"{part!r}: the id after ':' must be an integer") from None
        if value < 0:
            raise _fail(text, f"{part!r}: the id must be >= 0")
        found.append(Request(scenario, value))
    return found


def plants_trigger(cfg: Config, request: Request) -> bool:
    """Whether ``request`` plants the backdoor trigger (so triggered test samples measure it)."""
    return request.scenario == "sample" or (request.scenario == "client" and cfg["poison"] == "backdoor")


def check_requests(cfg: Config, scenarios: tuple[str, ...], num_classes: int, num_clients: int | None) -> None:
    """One ``ConfigError`` line for a stream that cannot run: a scenario the method does not support
    (``scenarios``), a class outside the task, a client outside the federation (once its size is
    known), a class or client named twice, more than one request planting the trigger."""
    if not cfg["requests"].strip():
        return
    text = cfg["requests"]
    requests = parse_requests(cfg)
    for request in requests:
        if request.scenario not in scenarios:
            raise _fail(text, f"scenario {request.scenario!r} is not supported by method '{cfg['method']}': "
                              f"each request must be one of {', '.join(scenarios)}")
        if request.scenario == "class" and not num_classes:
            raise _fail(text, f"task '{cfg['task']}' has no classes: a 'class' request does not apply")
        if request.scenario == "class" and request.target >= num_classes:
            raise _fail(text, f"class {request.target} is outside task '{cfg['task']}': must be in "
                              f"0..{num_classes - 1}")
        if request.scenario != "class" and num_clients is not None and request.target >= num_clients:
            raise _fail(text, f"client {request.target} ({request.label()}) is outside the federation: must be "
                              f"in 0..{num_clients - 1}")
    classes = [r.target for r in requests if r.scenario == "class"]
    clients = [r.target for r in requests if r.scenario != "class"]
    for kind, ids in (("class", classes), ("client", clients)):
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise _fail(text, f"{kind} {repeated[0]} is named twice: a {kind} can be removed once")
    triggered = [r.label() for r in requests if plants_trigger(cfg, r)]
    if len(triggered) > 1:
        raise _fail(text, f"{' and '.join(triggered)} both plant the backdoor trigger (one trigger, one target "
                          "label): a stream holds at most one such request")


def is_stream(cfg: Config) -> bool:
    return bool(cfg["requests"].strip())


def request_index(cfg: Config) -> int | None:
    """The index of the request a client view's ``cfg`` belongs to (0: before any request), None outside a stream."""
    return cfg.as_dict().get(INDEX_KEY)


def request_config(cfg: Config, index: int) -> Config:
    """The config of request ``index`` (1-based; 0: the federation before any request): its scenario
    and, for a class, ``forget-class``. ``forget-client`` stays the run's, which every request without
    an id takes (the clients resolve -1 to the largest client)."""
    requests = parse_requests(cfg)
    if not 0 <= index <= len(requests):
        raise ValueError(f"request {index} is not in the stream of {len(requests)} request(s)")
    changes: dict = {INDEX_KEY: index}
    if index:
        request = requests[index - 1]
        changes["scenario"] = request.scenario
        if request.scenario == "class":
            changes["forget-class"] = request.target
    return cfg.with_values(changes)


def view_key_part(cfg: Config) -> dict:
    """What a client view's cache key adds in a stream (the requests and the view's index); nothing outside one."""
    if not is_stream(cfg):
        return {}
    return {"requests": cfg["requests"], INDEX_KEY: request_index(cfg)}
