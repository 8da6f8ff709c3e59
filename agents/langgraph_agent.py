"""A LangGraph coding agent that calls the policy through the episode's proxy session.

The graph::

    START → model ─┬─ tool calls ─→ tools ─┬─→ model
                   │                       ├─→ summarize → model   (context near the window)
                   │                       └─→ END                 (submit, budget, env ended)
                   ├─ no tool call ─→ nudge → model   (at most ``nudges`` times in a row)
                   └─ error / budget ─→ END

- ``model`` calls LangChain's ``ChatOpenAI`` pointed at the episode's proxy session, with
  the env's tools (``info["tools"]``) bound, plus a ``subagent`` tool.
- ``tools`` executes each call with ``env.step`` (through ``EpisodeContext.step``) and puts
  the observation in the conversation as it is: the env has already cut it to its one
  output limit (``NL2RepoConfig.max_output_chars``), with a marker the model can read.
- ``summarize`` compacts the history when the last prompt used more than
  ``compact_fraction`` of the model's window: it asks the model for a summary of the
  conversation so far (that request extends the main context, so the proxy records it as
  a ``summary`` branch) and restarts the history from the task and that summary.
- The ``subagent`` tool runs the same graph with a fresh context (its own system prompt,
  no ``submit``, a smaller step budget) and returns its final answer; its requests carry
  the sub-agent header, so they form ``sub-agent`` branches.

The graph ends with an ``EndReason`` (submit, step or token budget, no tool call, context
full, model error, cancelled / time limit); ``run`` returns it in an ``AgentResult``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, TypedDict

from gyre_env.agents.base import AgentResult, AgentStop, EndReason, ModelFailure, episode_seed
from gyre_env.agents.context import EpisodeContext

from gyre_env._optional import require

SUBAGENT_TOOL = "subagent"
SUBAGENT_HEADER = "x-claude-code-agent-id"
"""Header the proxy's default branch classifier reads as "this call is a sub-agent's"."""
COMPACTION_PROMPT = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n"
    "Summarize the conversation so far for your own later use: the task, what you have "
    "built (files and their purpose), what works, what fails, and what remains to do. "
    "Wrap it in <summary></summary>."
)
"""The compaction request. Its first line is the marker the proxy's default classifier
reads as a ``summary`` branch (the same one Claude Code uses)."""

SYSTEM_PROMPT = (
    "You are a software engineer working alone in a sandbox. The workspace is the current "
    "directory. Build what the task asks using the tools: write files, run commands and "
    "tests, fix what fails. Every reply must call a tool. When the work is complete, call "
    "`submit`."
)
SUBAGENT_PROMPT = (
    "You are a helper agent with a fresh context, working in the same workspace as the "
    "agent that called you. Do the job you are given using the tools, then reply with a "
    "short report (no tool call) of what you did and found."
)
NUDGE = (
    "Your last reply called no tool. Reply with exactly one tool call (for example "
    "`list_dir` or `write_file`), or call `submit` if the work is done."
)


@dataclass(kw_only=True)
class LangGraphAgentConfig:
    """Budgets and knobs of the LangGraph agent."""

    max_steps: int = 60
    """Tool calls the main agent may make (a sub-agent has its own ``subagent_max_steps``)."""
    max_tokens: int = 400_000
    """Prompt + completion tokens over all model calls of the episode."""
    max_new_tokens: int = 512
    """Completion tokens per model call."""
    temperature: float = 1.0
    min_p: float = 0.0
    """Min-p filter (SGLang's and vLLM's ``min_p``, sent as an extra body field); 0: none,
    and the field is not sent, so any OpenAI-compatible server takes the requests."""
    seed: int | None = None
    """Sampling seed: an episode's calls use this plus a stable hash of its episode id, so
    rollouts can be replayed exactly; None samples with fresh randomness."""
    compact_fraction: float = 0.7
    """Compact the history once a prompt used more than this share of the context window."""
    nudges: int = 2
    """Consecutive replies without a tool call answered with a nudge before giving up."""
    max_compactions: int = 20
    """Compactions per episode before it ends with ``context_full``."""
    subagent: bool = True
    """Offer the ``subagent`` tool."""
    subagent_max_steps: int = 8
    request_timeout_s: float = 300.0
    model_retries: int = 2
    """Retries of a failed HTTP call (done by the OpenAI client)."""

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_tokens", "max_new_tokens", "subagent_max_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"LangGraphAgentConfig.{name} must be >= 1")
        if not 0 < self.compact_fraction < 1:
            raise ValueError("LangGraphAgentConfig.compact_fraction must be in (0, 1)")
        if not 0 <= self.min_p < 1:
            raise ValueError("LangGraphAgentConfig.min_p must be in [0, 1) (0 disables it)")


class GraphState(TypedDict, total=False):
    messages: list
    """LangChain messages of this (sub-)agent's context."""
    steps: int
    nudges: int
    prompt_tokens: int
    """Prompt tokens of the last model call (drives compaction)."""
    compactions: int
    compact: bool
    """The last model call did not fit the window: compact before the next one."""
    end: str | None
    """An ``EndReason`` value once the graph must stop."""
    end_message: str


@dataclass
class _Usage:
    """Model calls and tokens of one episode (shared by its sub-agents)."""

    calls: int = 0
    tokens: int = 0


class LangGraphAgent:
    """Builds a graph per episode (the graph closes over the episode's context)."""

    name = "langgraph"
    api = "openai"
    """It calls the model with LangChain's ``ChatOpenAI``."""

    def __init__(self, config: LangGraphAgentConfig | None = None):
        require("langgraph", "the LangGraph agent")
        langchain_openai = require("langchain_openai", "the LangGraph agent")
        self.config = config or LangGraphAgentConfig()
        # Finish the lazy imports of openai/httpx here, once: episode threads doing them
        # concurrently for the first time can see half-initialised modules.
        langchain_openai.ChatOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused")
        from langgraph.graph import StateGraph  # noqa: F401

    def run(self, ctx: EpisodeContext) -> AgentResult:
        ctx.model_endpoint(self.api, "the LangGraph agent")
        from langchain_core.messages import HumanMessage, SystemMessage

        usage = _Usage()
        tools = _openai_tools(ctx.tools)
        main_tools = [*tools, _subagent_schema()] if self.config.subagent else tools
        graph = _EpisodeGraph(self, ctx, usage, main_tools, role="main")
        state: GraphState = {
            "messages": [SystemMessage(SYSTEM_PROMPT), HumanMessage(str(ctx.observation))],
            "steps": 0,
        }
        from langgraph.errors import GraphRecursionError

        try:
            final = graph.invoke(state, self.config.max_steps)
        except GraphRecursionError as e:  # a safety net: budgets normally end the graph first
            return AgentResult(
                reason=EndReason.STEP_BUDGET,
                message=f"graph recursion: {e}",
                model_calls=usage.calls,
                tokens=usage.tokens,
            )
        except AgentStop as stop:
            return AgentResult(
                reason=stop.reason, message=str(stop), model_calls=usage.calls, tokens=usage.tokens
            )
        reason = EndReason(final.get("end") or EndReason.STEP_BUDGET.value)
        return AgentResult(
            reason=reason,
            message=final.get("end_message", ""),
            model_calls=usage.calls,
            tokens=usage.tokens,
            extra={"compactions": final.get("compactions", 0)},
        )


class _EpisodeGraph:
    """One compiled StateGraph bound to an episode (main agent or a sub-agent)."""

    def __init__(
        self,
        agent: LangGraphAgent,
        ctx: EpisodeContext,
        usage: _Usage,
        tools: list[dict],
        role: str,
    ):
        self.cfg = agent.config
        self.agent = agent
        self.ctx = ctx
        self.usage = usage
        self.tools = tools
        self.role = role
        self.llm = _chat_model(ctx, self.cfg, role).bind_tools(tools) if tools else None
        self.plain_llm = _chat_model(ctx, self.cfg, role)
        self.graph = self._build()

    def _build(self):
        from langgraph.graph import END, START, StateGraph

        g = StateGraph(GraphState)
        g.add_node("model", self.model_node)
        g.add_node("tools", self.tools_node)
        g.add_node("nudge", self.nudge_node)
        g.add_node("summarize", self.summarize_node)
        g.add_edge(START, "model")
        g.add_conditional_edges("model", self.after_model, ["tools", "nudge", "summarize", END])
        g.add_conditional_edges("tools", self.after_tools, ["model", "summarize", END])
        g.add_conditional_edges("nudge", lambda s: END if s.get("end") else "model", ["model", END])
        g.add_conditional_edges(
            "summarize", lambda s: END if s.get("end") else "model", ["model", END]
        )
        return g.compile()

    def invoke(self, state: GraphState, max_steps: int) -> GraphState:
        limit = 4 * (max_steps + self.cfg.nudges + 4) + 16
        return self.graph.invoke(state, {"recursion_limit": limit})

    # ------------------------------------------------------------------ nodes

    def model_node(self, state: GraphState) -> GraphState:
        if self.usage.tokens >= self.cfg.max_tokens:
            return {"end": EndReason.TOKEN_BUDGET.value, "end_message": "token budget spent"}
        self.ctx.check_live()
        try:
            reply = self._call(self.llm or self.plain_llm, state["messages"])
        except _ContextFull as e:
            if self.role != "main":
                return {"end": EndReason.CONTEXT_FULL.value, "end_message": str(e)}
            return {"compact": True}
        prompt_tokens = (reply.usage_metadata or {}).get("input_tokens", 0)
        return {"messages": [*state["messages"], reply], "prompt_tokens": prompt_tokens}

    def after_model(self, state: GraphState) -> str:
        from langgraph.graph import END

        if state.get("end"):
            return END
        if state.get("compact"):
            return "summarize"
        last = state["messages"][-1]
        if getattr(last, "tool_calls", None) or getattr(last, "invalid_tool_calls", None):
            return "tools"
        return "nudge"

    def nudge_node(self, state: GraphState) -> GraphState:
        from langchain_core.messages import HumanMessage

        used = state.get("nudges", 0)
        if self.role == "sub-agent":  # a sub-agent's plain answer is its report
            return {"end": EndReason.SUBMITTED.value, "end_message": "sub-agent answered"}
        if used >= self.cfg.nudges:
            return {
                "end": EndReason.NO_TOOL_CALL.value,
                "end_message": f"{used + 1} replies in a row without a tool call",
            }
        return {"messages": [*state["messages"], HumanMessage(NUDGE)], "nudges": used + 1}

    def tools_node(self, state: GraphState) -> GraphState:
        last = state["messages"][-1]
        out = list(state["messages"])
        steps = state.get("steps", 0)
        for bad in getattr(last, "invalid_tool_calls", None) or []:
            out.append(
                _tool_message(
                    bad.get("id"),
                    f"error: arguments of {bad.get('name')!r} "
                    f"are not valid JSON: {bad.get('error') or ''}",
                )
            )
        for call in last.tool_calls:
            if steps >= self._step_budget():
                return {
                    "messages": out,
                    "steps": steps,
                    "end": EndReason.STEP_BUDGET.value,
                    "end_message": f"{steps} steps",
                }
            text = self._execute(call)
            out.append(_tool_message(call["id"], text))
            steps += 1
            if call["name"] == "submit" or self.ctx.done:
                reason = EndReason.SUBMITTED if call["name"] == "submit" else EndReason.ENV_ENDED
                return {"messages": out, "steps": steps, "end": reason.value}
        if steps >= self._step_budget():
            return {
                "messages": out,
                "steps": steps,
                "end": EndReason.STEP_BUDGET.value,
                "end_message": f"{steps} steps",
            }
        if not last.tool_calls:  # only unparseable calls: counts like a reply without one
            used = state.get("nudges", 0) + 1
            if used > self.cfg.nudges:
                return {
                    "messages": out,
                    "end": EndReason.NO_TOOL_CALL.value,
                    "end_message": f"{used} replies in a row without a valid tool call",
                }
            return {"messages": out, "nudges": used}
        return {"messages": out, "steps": steps, "nudges": 0}

    def after_tools(self, state: GraphState) -> str:
        from langgraph.graph import END

        if state.get("end"):
            return END
        window = self.ctx.endpoint.context_length
        full = state.get("prompt_tokens", 0) > self.cfg.compact_fraction * window
        # A sub-agent is short-lived: it is not compacted (it ends if its context fills).
        return "summarize" if full and self.role == "main" else "model"

    def summarize_node(self, state: GraphState) -> GraphState:
        """Compact: ask for a summary (a ``summary`` branch), restart from it."""
        from langchain_core.messages import HumanMessage

        messages = state["messages"]
        done = state.get("compactions", 0)
        if done >= self.cfg.max_compactions:
            return {"end": EndReason.CONTEXT_FULL.value, "end_message": f"compacted {done} times"}
        keep = messages[:2]  # system prompt and task
        try:
            # Same tools as the main calls, so the request extends the main context's ids.
            reply = self._call(
                self.llm or self.plain_llm, [*messages, HumanMessage(COMPACTION_PROMPT)]
            )
            summary = _text(reply.content)
        except _ContextFull:  # too long even to summarize: drop the middle instead
            summary = "(earlier work was dropped to fit the context window)"
        note = HumanMessage(f"Summary of your work so far (the history was compacted):\n{summary}")
        return {
            "messages": [*keep, note],
            "prompt_tokens": 0,
            "compactions": done + 1,
            "compact": False,
        }

    # ------------------------------------------------------------------ helpers

    def _step_budget(self) -> int:
        return self.cfg.subagent_max_steps if self.role == "sub-agent" else self.cfg.max_steps

    def _call(self, llm, messages: list):
        """One model call, timed as ``model``; maps endpoint errors to typed stops."""
        import openai

        self.ctx.check_live()
        try:
            with self.ctx.clock.phase("model"):
                reply = llm.invoke(messages)
        except openai.BadRequestError as e:
            if "context" in str(e).lower() or "too long" in str(e).lower():
                raise _ContextFull(str(e)) from e
            raise ModelFailure(f"the model endpoint rejected the request: {e}") from e
        except openai.APIError as e:
            raise ModelFailure(f"model call failed: {type(e).__name__}: {e}") from e
        self.usage.calls += 1
        meta = reply.usage_metadata or {}
        self.usage.tokens += int(meta.get("total_tokens", 0))
        return reply

    def _execute(self, call: dict) -> str:
        if call["name"] == SUBAGENT_TOOL and self.role == "main" and self.cfg.subagent:
            return self._run_subagent(call.get("args") or {})
        obs, _, _, _, _ = self.ctx.step({"name": call["name"], "arguments": call.get("args") or {}})
        return obs if isinstance(obs, str) else json.dumps(obs, default=str)

    def _run_subagent(self, args: dict) -> str:
        from langchain_core.messages import HumanMessage, SystemMessage

        job = args.get("task")
        if not isinstance(job, str) or not job.strip():
            return "error: subagent needs a non-empty string argument 'task'"
        tools = [t for t in self.tools if t["function"]["name"] not in ("submit", SUBAGENT_TOOL)]
        sub = _EpisodeGraph(self.agent, self.ctx, self.usage, tools, role="sub-agent")
        state: GraphState = {"messages": [SystemMessage(SUBAGENT_PROMPT), HumanMessage(job)]}
        final = sub.invoke(state, self.cfg.subagent_max_steps)
        last = final["messages"][-1] if final.get("messages") else None
        answer = _text(getattr(last, "content", "")) if last is not None else ""
        return f"sub-agent ended ({final.get('end') or 'done'}): {answer or '(no report)'}"


class _ContextFull(Exception):
    """The prompt no longer fits the model's context window."""


def _chat_model(ctx: EpisodeContext, cfg: LangGraphAgentConfig, role: str):
    from langchain_openai import ChatOpenAI

    ep = ctx.endpoint
    headers = (
        {SUBAGENT_HEADER: f"{ctx.episode_id}-{uuid.uuid4().hex[:8]}"}
        if role == "sub-agent"
        else None
    )
    return ChatOpenAI(
        model=ep.model,
        base_url=ep.base_url,
        api_key=ep.api_key,
        temperature=cfg.temperature,
        seed=None if cfg.seed is None else episode_seed(cfg.seed, ctx.episode_id),
        max_tokens=cfg.max_new_tokens,
        timeout=cfg.request_timeout_s,
        max_retries=cfg.model_retries,
        default_headers=headers,
        extra_body={"min_p": cfg.min_p} if cfg.min_p else None,
        stream_usage=True,
    )


def _openai_tools(schemas: list[dict]) -> list[dict]:
    """The env's tool schemas in OpenAI's ``{"type": "function", "function": ...}`` shape."""
    out = []
    for schema in schemas:
        fn = schema.get("function", schema)
        if "name" not in fn:
            raise ValueError(f"tool schema without a name: {schema!r}")
        out.append(
            {
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "description": fn.get("description", ""),
                    "parameters": fn.get("parameters")
                    or fn.get("input_schema")
                    or {"type": "object", "properties": {}},
                },
            }
        )
    return out


def _subagent_schema() -> dict:
    return {
        "type": "function",
        "function": {
            "name": SUBAGENT_TOOL,
            "description": "Hand a self-contained job (e.g. 'write tests for parser.py and run "
            "them') to a helper agent with a fresh context; returns its report.",
            "parameters": {
                "type": "object",
                "properties": {
                    "task": {"type": "string", "description": "what the helper must do"}
                },
                "required": ["task"],
            },
        },
    }


def _tool_message(call_id: Any, text: str):
    from langchain_core.messages import ToolMessage

    return ToolMessage(content=text, tool_call_id=str(call_id or "call_invalid"))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)
