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
