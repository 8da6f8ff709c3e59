"""Gold trajectories as TITO records: the SFT warm start's data.

The agent that will later be trained (the LangGraph agent, same prompts, same tools)
runs episodes through the proxy as usual, but the engine behind the proxy is a
``ScriptedEngine`` whose replies are the task's gold tool calls, rendered by the
model's own chat template and tokenized by its tokenizer. The proxy records them like
any sampled answer, so SFT trains on exactly the token ids the policy must produce in
exactly the contexts it will see, and the records go through the same store, trees and
packing as RL data.
"""

from __future__ import annotations

import json

from gyre_env.agents.scripted import gold_actions


class GoldReplay:
    """``ScriptedEngine`` script: for a prompt, the next gold call of the task whose spec
    the prompt contains (the number of assistant turns so far says which call)."""

    def __init__(self, tokenizer, tasks):
        self.tokenizer = tokenizer
        self._tasks = []
        for task in tasks:
            if task.gold_dir is None:
                raise ValueError(f"task {task.id} has no gold solution to replay")
            self._tasks.append((task.spec.strip(), task.id, gold_actions(task.gold_dir)))
        self._tasks.sort(key=lambda t: -len(t[0]))  # the longest spec wins a tie
        base = [{"role": "user", "content": "x"}]
        self._head = self._render(base, add_generation_prompt=True)
        self._turn_marker = self._head[len(self._render(base)) :]
        if not self._turn_marker:
            raise ValueError("the chat template has no assistant generation prompt")
        self._cache: dict[tuple[str, int], list[int]] = {}

    def _render(self, messages, **kw) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, **kw)

    def reply_text(self, action: dict) -> str:
        """The assistant turn that makes ``action``, as the chat template renders it."""
        call = {
            "type": "function",
            "id": "call_0",
            "function": {"name": action["name"], "arguments": json.dumps(action["arguments"])},
        }
        base = [{"role": "user", "content": "x"}]
        full = self._render([*base, {"role": "assistant", "content": "", "tool_calls": [call]}])
        if not full.startswith(self._head):
            raise ValueError("the chat template renders history differently from prompts")
        return full[len(self._head) :].rstrip("\n")

    def __call__(self, prompt_ids: list[int], params) -> list[int]:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        for spec, task_id, actions in self._tasks:
            if spec in text:
                turn = max(text.count(self._turn_marker) - 1, 0)
                key = (task_id, min(turn, len(actions) - 1))
                if key not in self._cache:
                    reply = self.reply_text(actions[key[1]])
                    self._cache[key] = self.tokenizer.encode(reply, add_special_tokens=False)
                return list(self._cache[key])
        raise ValueError("gold replay: the prompt contains none of the tasks' specs")


class GoldSet:
    """The gold episodes of a run's store (run ``sft``) and their records, read once: the
    data of SFT and of the gold steps between RL iterations."""

    def __init__(self, store):
        self.store = store
        self._data: tuple[list, dict] | None = None

    def episodes(self) -> tuple[list, dict]:
        """(gold episodes, their records by session); no gold is a RuntimeError."""
        if self._data is None:
            episodes = [e for e in self.store.episodes(run="sft") if e.outcome != "infra_error"]
            if not episodes:
                raise RuntimeError("no gold trajectories in the store (run 'sft')")
            records = {e.session: list(self.store.records([e.session])) for e in episodes}
            self._data = episodes, records
        return self._data

    def batch(self, rng, batch_size: int, sample_cfg):
        """An SFT ``TrainBatch``: ``batch_size`` gold episodes drawn with ``rng``."""
        from gyre_env.trainers.protocol import TrainBatch
        from gyre_env.trajectory.sampling import packed_units
        from gyre_env.trajectory.tree import build_trees

        episodes, records = self.episodes()
        n = min(batch_size, len(episodes))
        pick = [episodes[i] for i in rng.choice(len(episodes), n, False)]
        trees = build_trees([r for e in pick for r in records[e.session]], pick)
        return TrainBatch(units=packed_units(trees, sample_cfg), kind="sft")
