"""Sessions, branches and prefix reuse: which exact ids a call's prompt starts with.

Each session (one episode) keeps a node per model call. A node remembers a hash chain of
the messages that produced it (plus its reply) and the exact prompt+output ids. A new
request whose messages extend a node's messages and reply reuses those ids verbatim and
tokenizes only what follows (:meth:`ChatRenderer.render_delta`); the sampled ids are never
re-tokenized. A request that extends no node is rendered in full and starts a new branch.

Where templates re-render earlier turns differently — an assistant turn whose JSON or
thinking the template reformats, a stop string the client never saw, a reply cut at the
length limit — the recorded ids stay the ones sampled, and the template's turn closing
is appended after them (:meth:`ChatRenderer.closing_after`).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import is_

from gyre_env.proxy.bodies import BodyMemo
from gyre_env.proxy.chat import ConversionMemo, RequestError
from gyre_env.proxy.render import ChatRenderer, reply_key
from gyre_env.proxy.responses_api import ResponseLog
from gyre_env.trajectory.records import BranchRole

COMPACTION_MARKER = "CRITICAL: Respond with TEXT ONLY"
SUBAGENT_BILLING_MARK = "cc_is_subagent=true"


@dataclass(kw_only=True)
class CallContext:
    """What a branch classifier sees about a call."""

    session: str
    messages: list[dict]
    """Internal-form messages (system text included as the first message, if any)."""
    headers: dict[str, str]
    """Request headers, lower-cased names."""
    api: str


BranchClassifier = Callable[[CallContext], BranchRole]


def default_classifier(ctx: CallContext) -> BranchRole:
    """Recognises Claude Code's calls: a compaction request (its last user message starts
    a ``CRITICAL: Respond with TEXT ONLY`` block) is ``summary``; a sub-agent (header
    ``x-claude-code-agent-id`` or ``cc_is_subagent=true`` in the system prompt) is
    ``sub-agent``; everything else is ``main``."""
    for msg in reversed(ctx.messages):
        if msg["role"] == "user":
            if COMPACTION_MARKER in (msg.get("content") or ""):
                return "summary"
            break
    if "x-claude-code-agent-id" in ctx.headers:
        return "sub-agent"
    for msg in ctx.messages:
        if msg["role"] != "system":
            break
        if SUBAGENT_BILLING_MARK in (msg.get("content") or ""):
            return "sub-agent"
    return "main"


def message_key(msg: dict) -> tuple:
    """Hashable identity of one internal message, exactly as the client sent it.

    Exact (no whitespace normalisation) so that hashing a 128k-token conversation costs a
    memory pass; only the one assistant message that may be a previous reply is compared
    loosely (:func:`reply_of`)."""
    calls = msg.get("tool_calls")
    calls_key = (
        tuple((c["function"]["name"], _canonical(c["function"]["arguments"])) for c in calls)
        if calls
        else ()
    )
    return (
        msg["role"],
        msg.get("content") or "",
        msg.get("tool_call_id") or "",
        msg.get("name") or "",
        msg.get("reasoning_content") or "",
        calls_key,
    )


def reply_of(msg: dict) -> tuple:
    """Loose identity of an assistant message, to match it with a reply the proxy gave."""
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or ()
    ]
    return reply_key(msg.get("content") or "", calls)


def _canonical(args) -> str:
    return args if isinstance(args, str) else _dumps_sorted(args)


try:
    import orjson

    def _dumps_sorted(obj) -> str:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()

except ImportError:  # pragma: no cover - depends on the environment

    def _dumps_sorted(obj) -> str:
        return json.dumps(obj, sort_keys=True)


def chain_hashes(messages: list[dict], tools: list[dict] | None) -> list[int]:
    """``h[i]`` identifies (tools, messages[:i]); cost is one pass over the messages."""
    tools_blob = _dumps_sorted(tools) if tools else ""
    h = [hash(("tools", tools_blob))]
    for msg in messages:
        h.append(hash((h[-1], message_key(msg))))
    return h


def signature_chain(keys: list[tuple], tools_blob: str) -> list[int]:
    """``h[i]`` stands for (tools, messages[:i]) by the messages' roles and lengths only:
    cheap whatever the content length. Equal prompts give equal chains; candidates found
    this way are then compared exactly (``==`` on the keys, a memory compare)."""
    return extend_signature_chain([hash((len(tools_blob), tools_blob[:64]))], keys)


def extend_signature_chain(h: list[int], keys: list[tuple]) -> list[int]:
    """``h`` (a chain) continued over ``keys``, the messages after those it covers."""
    last = h[-1]
    for role, content, call_id, _, reasoning, calls in keys:
        last = hash((last, role, len(content), call_id, len(reasoning), len(calls)))
        h.append(last)
    return h


def tools_blob(tools: list[dict] | None) -> str:
    return _dumps_sorted(tools) if tools else ""


@dataclass(eq=False)
class Node:
    """One finished call in a session's tree.

    A node stores only what it adds to its parent: the ids after the parent's prompt+output
    and the message keys after the parent's prompt messages. Storage per session grows
    with its tokens, not with calls x context, and recording a call costs O(new tokens).
    The segments are tuples of atoms, which the garbage collector stops scanning.
    """

    call_index: int
    branch: str
    role: BranchRole
    prompt_hash: int
    reply: tuple
    """:func:`reply_key` of the answer this call returned."""
    n_prompt: int
    closing: str
    """Text appended after this call's output when a later prompt extends it."""
    id_seg: tuple[int, ...]
    """This call's prompt ids after ``prefix_len``, then its output ids."""
    key_seg: tuple[tuple, ...]
    """:func:`message_key` of the prompt messages after the parent's prompt messages."""
    n_messages: int
    tools: str
    """Canonical JSON of the tools offered (they are part of the prompt)."""
    parent: Node | None = None
    prefix_len: int = 0
    """Length of the parent's prompt+output ids (0 without a parent)."""
    claimed: bool = False
    """A later call continues this node's branch (others extending it fork a new one)."""

    def _chain(self, attr: str) -> list:
        segs, node = [], self
        while node is not None:
            segs.append(getattr(node, attr))
            node = node.parent
        out: list = []
        for seg in reversed(segs):
            out += seg
        return out

    def full_ids(self) -> list[int]:
        """Prompt+output ids (a new list)."""
        return self._chain("id_seg")

    def prompt_keys(self) -> list[tuple]:
        return self._chain("key_seg")

    def has_prompt(self, keys: list[tuple], tools: str) -> bool:
        """Exactly these prompt messages and tools (a memory compare of the strings)."""
        return self.n_messages == len(keys) and self.tools == tools and self.prompt_keys() == keys


@dataclass(kw_only=True)
class PromptPlan:
    """How a request's prompt is built, decided before generation."""

    prompt_ids: list[int]
    parent: Node | None
    prefix_len: int
    """Leading ids copied from ``parent`` (prompt+output); the rest were tokenized now."""
    branch: str
    role: BranchRole
    prompt_hash: int
    new_branch: bool
    keys: list[tuple]
    tools: str
    render_mismatch: bool = False


@dataclass(kw_only=True)
class Match:
    """What :meth:`Session.match` found; :meth:`Session.build` turns it into a plan."""

    messages: list[dict]
    tools: list[dict] | None
    role: BranchRole
    keys: list[tuple]
    blob: str
    hashes: list[int]
    node: Node | None = None
    """The call this request extends (its reply is ``messages[i - 1]``)."""
    i: int = 0
    plan: PromptPlan | None = None
    """Set when the request repeats an earlier prompt exactly."""

    def common(self) -> dict:
        return {
            "role": self.role,
            "prompt_hash": self.hashes[-1],
            "keys": self.keys,
            "tools": self.blob,
        }

    @property
    def render_chars(self) -> int:
        """Characters of message text that :meth:`Session.build` will render and tokenize."""
        if self.plan is not None:
            return 0
        todo = self.messages if self.node is None else self.messages[self.i :]
        return sum(len(msg.get("content") or "") for msg in todo)


@dataclass
class Session:
    """Calls of one episode. Planning and committing take the session's lock briefly."""

    name: str
    max_nodes: int = 512
    calls: int = 0
    branches: int = 0
    nodes: OrderedDict = field(default_factory=OrderedDict)
    by_prompt: dict = field(default_factory=dict)
    """prompt hash -> calls with exactly that prompt (oldest first)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    memos: dict = field(default_factory=dict)
    """API name -> :class:`ConversionMemo`, ``("body", api)`` -> :class:`BodyMemo`, of the
    session's last request."""
    responses: ResponseLog = field(default_factory=ResponseLog)
    """The session's stored Responses-API responses (``previous_response_id``)."""
    last_keys: list = field(default_factory=list)
    """(messages, keys, chain, tools) of the last two requests matched, most recent first,
    to reuse the keys and chain of messages that are the very same objects (see
    :meth:`keys_and_chain`)."""

    def memo(self, api: str) -> ConversionMemo:
        """The conversion memo of this session's requests in ``api``."""
        memo = self.memos.get(api)
        if memo is None:
            memo = self.memos[api] = ConversionMemo()
        return memo

    def body_memo(self, api: str) -> BodyMemo:
        """The body memo of this session's requests in ``api`` (holds its last large body)."""
        memo = self.memos.get(("body", api))
        if memo is None:
            memo = self.memos[("body", api)] = BodyMemo()
        return memo

    def keys_and_chain(self, messages: list[dict], blob: str) -> tuple[list, list[int]]:
        """:func:`message_key` of each message and their :func:`signature_chain`.

        Messages that are the same objects as the last request's leading ones (a
        :class:`ConversionMemo` reused them) keep that request's keys and chain: the cost
        is a pointer comparison per earlier message, and later comparisons of these keys
        with the session's stored ones (the same objects) are pointer comparisons too."""
        for entry in self.last_keys:
            old_msgs, old_keys, old_chain, old_blob = entry
            n = len(old_msgs)
            if n and len(messages) >= n and old_blob == blob and all(map(is_, messages, old_msgs)):
                self.last_keys.remove(entry)
                new_keys = [message_key(m) for m in messages[n:]]
                keys = old_keys + new_keys
                chain = extend_signature_chain(old_chain[:], new_keys)
                break
        else:
            keys = [message_key(m) for m in messages]
            chain = signature_chain(keys, blob)
        if self.calls:  # a session's first call is often its only one (keep no state)
            self.last_keys.insert(0, (messages, keys, chain, blob))
            del self.last_keys[2:]
        return keys, chain

    def plan(
        self,
        renderer: ChatRenderer,
        messages: list[dict],
        tools: list[dict] | None,
        role: BranchRole,
        *,
        verify: bool = False,
    ) -> PromptPlan:
        """Choose the parent call and build the prompt ids (reusing the parent's ids)."""
        return self.build(renderer, self.match(messages, tools, role), verify=verify)

    def match(self, messages: list[dict], tools: list[dict] | None, role: BranchRole) -> Match:
        """The cheap half of :meth:`plan`: find the call this request extends (or repeats)."""
        blob = tools_blob(tools)
        with self.lock:
            keys, hashes = self.keys_and_chain(messages, blob)
        m = Match(messages=messages, tools=tools, role=role, keys=keys, blob=blob, hashes=hashes)
        with self.lock:
            for node in reversed(self.by_prompt.get(hashes[-1], ())):
                if node.has_prompt(keys, blob):  # the same prompt again (a retry, more samples)
                    m.plan = PromptPlan(
                        prompt_ids=node.full_ids()[: node.n_prompt],
                        parent=node.parent,
                        prefix_len=node.prefix_len,
                        branch=self._new_branch(),
                        new_branch=True,
                        **m.common(),
                    )
                    return m
            m.node, m.i = self._find_parent(messages, keys, blob, hashes)
        return m

    def build(self, renderer: ChatRenderer, m: Match, *, verify: bool = False) -> PromptPlan:
        """The rendering half of :meth:`plan` (thread-safe: may run off the event loop)."""
        if m.plan is not None:
            return m.plan
        node, i, messages, tools = m.node, m.i, m.messages, m.tools
        if node is None:
            prompt_ids = renderer.encode(renderer.render(messages, tools))
            with self.lock:
                branch = self._new_branch()
            return PromptPlan(
                prompt_ids=prompt_ids,
                parent=None,
                prefix_len=0,
                branch=branch,
                new_branch=True,
                **m.common(),
            )
        head = _leading_system(messages[: i - 1])
        delta = renderer.render_delta(head, messages[i - 1], messages[i:], tools)
        mismatch = False
        if verify:
            exact = _exact_delta(renderer, messages, i, tools)
            mismatch = exact != delta
            delta = exact if exact is not None else delta
        suffix = renderer.encode(node.closing + delta)
        ids = node.full_ids()  # a new list: it becomes the prompt
        prefix_len = len(ids)
        ids += suffix
        with self.lock:
            if m.role == node.role and not node.claimed:
                node.claimed, branch, new_branch = True, node.branch, False
            else:
                branch, new_branch = self._new_branch(), True
        return PromptPlan(
            prompt_ids=ids,
            parent=node,
            prefix_len=prefix_len,
            branch=branch,
            new_branch=new_branch,
            render_mismatch=mismatch,
            **m.common(),
        )

    def _find_parent(
        self, messages: list[dict], keys: list[tuple], blob: str, hashes: list[int]
    ) -> tuple[Node | None, int]:
        """The latest call whose prompt is exactly ``messages[:i-1]`` and whose reply is
        ``messages[i-1]``, for the largest such ``i`` (the caller holds the lock)."""
        for i in range(len(messages) - 1, 0, -1):
            if messages[i - 1]["role"] != "assistant":
                continue
            candidates = self.by_prompt.get(hashes[i - 1])
            if candidates:
                reply = reply_of(messages[i - 1])
                for node in reversed(candidates):
                    if node.reply == reply and node.has_prompt(keys[: i - 1], blob):
                        return node, i
        return None, 0

    def _new_branch(self) -> str:
        """A fresh branch id; the caller holds the lock."""
        name = f"b{self.branches}"
        self.branches += 1
        return name

    def abandon(self, plan: PromptPlan) -> None:
        """A planned call failed: let the next extension of its parent continue the branch."""
        parent = plan.parent
        if parent is not None and not plan.new_branch:
            with self.lock:
                parent.claimed = False

    def next_call_index(self) -> int:
        with self.lock:
            index = self.calls
            self.calls += 1
        return index

    def commit(
        self, plan: PromptPlan, call_index: int, output_ids: list[int], reply: tuple, closing: str
    ) -> Node:
        """Remember a finished call so later requests can extend it (cost: its new tokens)."""
        parent = plan.parent
        node = Node(
            call_index=call_index,
            branch=plan.branch,
            role=plan.role,
            prompt_hash=plan.prompt_hash,
            reply=reply,
            n_prompt=len(plan.prompt_ids),
            closing=closing,
            id_seg=tuple(plan.prompt_ids[plan.prefix_len :]) + tuple(output_ids),
            key_seg=tuple(plan.keys[parent.n_messages if parent is not None else 0 :]),
            n_messages=len(plan.keys),
            tools=plan.tools,
            parent=parent,
            prefix_len=plan.prefix_len,
        )
        with self.lock:
            self.nodes[call_index] = node
            self.by_prompt.setdefault(node.prompt_hash, []).append(node)
            while len(self.nodes) > self.max_nodes:
                self._forget(self.nodes.popitem(last=False)[1])
        return node

    def _forget(self, node: Node) -> None:
        same = self.by_prompt.get(node.prompt_hash)
        if same is not None:
            same.remove(node)
            if not same:
                del self.by_prompt[node.prompt_hash]


def _leading_system(messages: list[dict]) -> list[dict]:
    head = []
    for msg in messages:
        if msg["role"] != "system":
            break
        head.append(msg)
    return head


def _exact_delta(renderer: ChatRenderer, messages: list[dict], i: int, tools) -> str | None:
    """The new messages' text cut from a full render (cost grows with the context), or
    None when the template does not render the earlier turns as a prefix."""
    before = renderer.render(messages[:i], tools, generation_prompt=False)
    full = renderer.render(messages, tools, generation_prompt=True)
    return full[len(before) :] if full.startswith(before) else None


class SessionStore:
    """Sessions by name. A live session (an episode still running) is never evicted: that
    would restart its call indexes at 0, and the record store refuses the duplicates, so
    the episode's later calls would be lost. :meth:`release` marks an episode's session
    finished and frees its cache; only finished sessions are evicted, oldest release first,
    once ``max_sessions`` are held. With that many live sessions a new one is refused (503).
    """

    def __init__(self, *, max_sessions: int = 4096, max_nodes: int = 512):
        self.max_sessions = max_sessions
        self.max_nodes = max_nodes
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._finished: OrderedDict[str, None] = OrderedDict()
        """Names of released sessions, oldest release first (the eviction order)."""
        self._lock = threading.Lock()

    def get(self, name: str) -> Session:
        """The session ``name``, created if new; a released one is live again (its call
        indexes continue where they stopped)."""
        with self._lock:
            session = self._sessions.get(name)
            if session is not None:
                self._finished.pop(name, None)
                self._sessions.move_to_end(name)
                return session
            while len(self._sessions) >= self.max_sessions and self._finished:
                self._sessions.pop(self._finished.popitem(last=False)[0], None)
            if len(self._sessions) >= self.max_sessions:
                raise RequestError(
                    f"the proxy holds {self.max_sessions} live sessions (max_sessions) and "
                    f"evicts none of them: refusing new session {name[:40]!r}. End finished "
                    "episodes' sessions (DELETE /s/<session>, ModelService.release) or raise "
                    "max_sessions",
                    status=503,
                )
            session = self._sessions[name] = Session(name, max_nodes=self.max_nodes)
            return session

    def release(self, name: str) -> bool:
        """Mark ``name`` finished: its prefix cache is freed now, its call count kept until
        it is evicted. Returns whether the session existed."""
        with self._lock:
            session = self._sessions.get(name)
            if session is None:
                return False
            self._finished[name] = None
            self._finished.move_to_end(name)
        with session.lock:
            session.nodes.clear()
            session.by_prompt.clear()
            session.memos.clear()
            session.last_keys.clear()
            session.responses.entries.clear()
        return True

    def live(self) -> int:
        """Sessions not released."""
        with self._lock:
            return len(self._sessions) - len(self._finished)

    def __len__(self) -> int:
        return len(self._sessions)
