"""What every unlearning method provides to the ServerApp.

A method is a Flower ``Strategy`` (it aggregates what clients send) with an ``unlearn`` entry
point: given the federation and the original model, return the unlearned model. Reversible
methods also ``restore``. The ServerApp knows nothing else about a method's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from flwr.app import ArrayRecord

from strategies.common.federation import Federation


@dataclass
class ModelState:
    """Weights plus the plug-in specs they belong to (the architecture clients must build)."""

    arrays: ArrayRecord
    plugins: list[dict] = field(default_factory=list)


@dataclass
class UnlearnContext:
    """Everything a method may use: the federation, the typed config, the original model.

    ``model_factory(plugins)`` builds a fresh model of the task (server-side filter training);
    ``train_config`` holds the run's local-training settings for ``train`` messages;
    ``retrain`` returns the cached retrain-oracle model (computing it when missing);
    ``original_id`` names the original model (its cache id): what clients kept from its
    pretraining is stored under it (``client_app.kept_models``); ``pretraining`` holds what the
    server kept from pretraining for the method (``update-history``: ``server_app.history``, and
    ``history_bytes``, its size on disk).
    """

    fed: Federation
    cfg: object
    original: ModelState
    model_factory: Callable[[list[dict]], object]
    retrain: Callable[[], ModelState]
    original_id: str = ""
    pretraining: dict = field(default_factory=dict)

    def update_history(self, method: str) -> dict:
        """Pretraining's kept rounds (``server_app.history``), or a one-line stop naming ``method``."""
        from strategies.common.federation import RunStopped

        rounds = self.pretraining.get("update-history")
        if not rounds:
            raise RunStopped(f"phase 'unlearn': {method} needs the update history of pretraining, and none was kept")
        return rounds


@dataclass
class UnlearnResult:
    """The unlearned model and method-specific facts that go into results.json under ``method``."""

    model: ModelState
    details: dict = field(default_factory=dict)
    #: the unlearned model is a cached build of this kind (``retrain``): its unlearning cost is what
    #: building it cost, not the cache lookup of this run
    built: str | None = None


class UnlearningMethod:
    """Interface: ``unlearn`` (required) and, for ``reversible`` methods, ``restore``."""

    name = "abstract"
    reversible = False
    #: each request adds its own plug-ins and leaves earlier ones as they are, so in a stream of
    #: requests any one request can be undone alone (:meth:`unplug`)
    stacks = False

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        raise NotImplementedError

    def own_original(self, cfg) -> dict:
        """A method whose original differs from the shared one (its pretraining does something else)
        returns what identifies it: added to the original's cache key and shown in results.json
        (``run.own_original``), so tables never mix it with the shared original without saying."""
        return {}

    def pretraining_aggregate(self, cfg):
        """For a method with its own original: ``aggregate(replies) -> ArrayRecord`` replacing FedAvg's
        aggregation in its pretraining rounds (None: plain FedAvg)."""
        return None

    def pretraining_config(self, cfg, original_id: str) -> dict:
        """For a method with its own original: entries added to every pretraining ``train`` config
        (FedAU names its local objective and the original's id, under which its clients keep what
        they train beside the model). Empty: the shared pretraining, unchanged."""
        return {}

    def history_interval(self, cfg) -> int:
        """For a method that needs ``update-history``: keep every this-many-th pretraining round."""
        return 1

    def restore(self, unlearned: ModelState, ctx: UnlearnContext) -> ModelState:
        raise NotImplementedError(f"method '{self.name}' is not reversible")

    def unplug(self, model: ModelState, indices: list[int]) -> ModelState:
        """For a method that ``stacks``: ``model`` without the plug-ins at ``indices`` (one request's),
        the others kept as they are (:func:`without_plugins`)."""
        if not self.stacks:
            raise NotImplementedError(f"method '{self.name}' does not stack its requests' plug-ins")
        return without_plugins(model, indices)


def without_plugins(model: ModelState, indices: list[int]) -> ModelState:
    """``model`` without the plug-ins at ``indices``: their tensors dropped, the later plug-ins renumbered
    (``plugins.<i>.`` follows the spec list), every other tensor the very same. A model built from the
    result computes what the stack without those plug-ins computes."""
    from tasks.model import PLUGIN_PREFIX

    drop = set(indices)
    kept = [i for i in range(len(model.plugins)) if i not in drop]
    renumber = {old: new for new, old in enumerate(kept)}
    state = {}
    for key, value in model.arrays.to_torch_state_dict().items():
        if key.startswith(PLUGIN_PREFIX):
            index, _, rest = key[len(PLUGIN_PREFIX):].partition(".")
            if int(index) in drop:
                continue
            key = f"{PLUGIN_PREFIX}{renumber[int(index)]}.{rest}"
        state[key] = value
    return ModelState(ArrayRecord(state), [model.plugins[i] for i in kept])
