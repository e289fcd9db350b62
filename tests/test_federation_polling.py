"""``Federation`` pulls replies from a push/pull grid (Deployment, simulation) on its own short poll."""

from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from flwr.supercore.task_identity import TaskIdentity

from strategies.common.federation import Federation


class _PushPullGrid:
    """Answers each pushed message after ``delay_pulls`` pulls; ``silent`` node ids never answer."""

    def __init__(self, delay_pulls: int, silent=()):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # as the in-process grid
        self.delay_pulls, self.silent = delay_pulls, set(silent)
        self.pushed: dict[str, Message] = {}
        self.pulls = 0

    def get_node_ids(self):
        return [1, 2, 3]

    def push_messages(self, messages):
        ids = []
        for i, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"m{i}"
            self.pushed[f"m{i}"] = message
            ids.append(f"m{i}")
        return ids

    def pull_messages(self, message_ids):
        self.pulls += 1
        if self.pulls <= self.delay_pulls:
            return []
        out = []
        for mid in sorted(message_ids):
            message = self.pushed[mid]
            if message.metadata.dst_node_id in self.silent:
                continue
            reply = Message(RecordDict({"hello": MetricRecord({"client-id": message.metadata.dst_node_id})}),
                            reply_to=message)
            out.append(reply)
        return out


def _messages(grid):
    return [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n, message_type="query.hello")
            for n in grid.get_node_ids()]


def test_replies_that_arrive_late_are_pulled_on_the_short_poll():
    grid = _PushPullGrid(delay_pulls=2)
    fed = Federation(grid, round_timeout=5.0, min_reply_fraction=1.0)
    replies = fed.exchange(_messages(grid), round_no=1)
    assert sorted(r.metadata.src_node_id for r in replies) == [1, 2, 3]
    assert grid.pulls == 3  # two empty pulls, then all replies: no 3 s wait between them


def test_a_silent_node_is_reported_once_the_round_timeout_ends():
    grid = _PushPullGrid(delay_pulls=0, silent={3})
    fed = Federation(grid, round_timeout=0.5, min_reply_fraction=0.5)
    replies = fed.exchange(_messages(grid), round_no=1)
    assert sorted(r.metadata.src_node_id for r in replies) == [1, 2]
    assert [f["node_id"] for f in fed.cost("setup").failures] == [3]
    assert "round-timeout=0.5s" in fed.cost("setup").failures[0]["reason"]


class _LostNodeGrid(_PushPullGrid):
    """From pull ``lost_from`` on, node ``lost`` is gone: the SuperLink answers in its place with a
    NODE_UNAVAILABLE error from its own node id (what Flower does once the node's heartbeat stops)."""

    def __init__(self, lost: int, lost_from: int):
        super().__init__(delay_pulls=0)
        self.lost, self.lost_from = lost, lost_from

    def pull_messages(self, message_ids):
        from flwr.app.error import Error
        from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

        self.pulls += 1
        out = []
        for mid in sorted(message_ids):
            message = self.pushed[mid]
            node = message.metadata.dst_node_id
            if node == self.lost and self.pulls >= self.lost_from:
                reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Error: Node Unavailable"), reply_to=message)
                reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            else:
                reply = Message(RecordDict({"hello": MetricRecord({"client-id": node})}), reply_to=message)
            out.append(reply)
        return out


def _known(fed, grid):
    from strategies.common.federation import NodeInfo

    fed.nodes = {n: NodeInfo(n, n - 1) for n in grid.get_node_ids()}  # what hello would have told


def test_a_node_lost_mid_phase_is_named_once_with_what_noticed_it_and_the_phase_goes_on():
    """Node 3 dies after round 1: the SuperLink's error reply (from node id 1) is attributed to node 3,
    listed once for the phase with every round it missed, and the rounds go on with two of three."""
    grid = _LostNodeGrid(lost=3, lost_from=2)
    fed = Federation(grid, round_timeout=5.0, min_reply_fraction=0.5)
    _known(fed, grid)
    fed.start_phase("pretrain")
    for round_no in (1, 2, 3, 4):
        replies = fed.exchange(_messages(grid), round_no=round_no)
        assert len(replies) == (3 if round_no == 1 else 2)
    [failure] = fed.cost("pretrain").failures
    assert (failure["node_id"], failure["client_id"], failure["round"]) == (3, 2, 2)
    assert failure["noticed_by"] == "heartbeat" and failure["rounds"] == [2, 3, 4]
    assert failure["not_asked"] == [3, 4]  # dropped at once: the SuperLink said it is gone
    assert fed.missed("pretrain") == [{"client_id": 2, "node_id": 3, "rounds": [2, 3, 4]}]
    assert fed.describe(fed.cost("pretrain").failures) == "2"
    fed.start_phase("continue")  # another phase names it again, once
    fed.exchange(_messages(grid), round_no=1)
    assert [(f["phase"], f["node_id"]) for f in fed.cost("continue").failures] == [("continue", 3)]


def test_a_round_below_min_reply_fraction_still_fails_naming_the_lost_node():
    import pytest

    from strategies.common.federation import RoundFailed

    grid = _LostNodeGrid(lost=3, lost_from=1)
    fed = Federation(grid, round_timeout=5.0, min_reply_fraction=1.0)
    _known(fed, grid)
    with pytest.raises(RoundFailed, match=r"only 2 of 3 nodes replied, 3 needed \(node 3 failed \(client 2\)"):
        fed.exchange(_messages(grid), round_no=1)


def test_failures_of_a_node_unknown_to_hello_are_described_without_crashing():
    fed = Federation(_PushPullGrid(0), round_timeout=1.0, min_reply_fraction=0.5)
    failures = [{"client_id": None, "node_id": 77}, {"client_id": 2, "node_id": 5}, {"client_id": 0, "node_id": 4}]
    assert fed.describe(failures) == "0, 2, node 77"
