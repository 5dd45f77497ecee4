"""The probe suite file: a TOML document in the repository of the team that owns the contract.

A suite names the provider, the pinned model id (a dated snapshot; an alias is refused unless
``allow_alias = true``), the prompt version and contract its outputs are recorded under, the
tools or response format offered, and its cases: input messages and, for tool calls, the
expected *first* decision (the tool and its critical arguments, or no tool at all). The README
("Probes and shadows") has a complete example.

Matching rules for an argument (``[cases.expect.arguments]``), one per argument::

    order_id = "A-1"                                  # exact (shorthand)
    order_id = { exact = "A-1" }                      # exact: equal JSON values
    priority = { one_of = ["high", "urgent"] }        # one of these values
    amount = { number = 42.5, tolerance = 0.01 }      # a number within the tolerance
    city = { case_insensitive = "Paris" }             # a string, case folded

Every refusal names the key and the reason (``SuiteInvalid``), like the service's configuration.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shapewatch.baselines import is_unpinned

from ..errors import ConfigInvalid

__all__ = [
    "MAX_CASES",
    "MAX_SUITE_BYTES",
    "PROVIDERS",
    "Case",
    "Expected",
    "Match",
    "Suite",
    "SuiteInvalid",
    "load_suite",
    "parse_suite",
    "suite_case",
    "suite_case_toml",
]

PROVIDERS = ("openai", "anthropic", "gemini", "command")
#: A suite's bounds: its file, its cases (a run costs at most cases x max_attempts requests),
#: the messages of one case and the tools offered.
MAX_SUITE_BYTES = 1 << 20
MAX_CASES = 500
MAX_MESSAGES = 50
MAX_TOOLS = 64
MAX_NAME = 200
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}")
_ENV = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
_ROLES = ("system", "user", "assistant")
DEFAULT_THRESHOLDS = {"tool_accuracy": 0.95, "argument_accuracy": 0.90, "spurious_calls": 0.02}


class SuiteInvalid(ConfigInvalid):
    """A suite file that cannot be run: ``key`` names the place (``cases[3].expect.tool``)."""


@dataclass(frozen=True)
class Match:
    """How one critical argument is matched: ``exact``, ``one_of``, ``number`` (with
    ``tolerance``) or ``case_insensitive``."""

    rule: str
    value: Any
    tolerance: float = 0.0

    def matches(self, actual: Any) -> bool:
        if self.rule == "exact":
            return bool(_same(actual, self.value))
        if self.rule == "one_of":
            return any(_same(actual, v) for v in self.value)
        if self.rule == "number":
            return (
                isinstance(actual, int | float)
                and not isinstance(actual, bool)
                and math.isfinite(actual)
                and abs(actual - self.value) <= self.tolerance
            )
        return isinstance(actual, str) and actual.casefold() == str(self.value).casefold()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {self.rule: self.value}
        if self.rule == "number":
            out["tolerance"] = self.tolerance
        return out


def _same(a: Any, b: Any) -> bool:
    # JSON equality: 1 == 1.0, but true is not 1
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


@dataclass(frozen=True)
class Expected:
    """The expected first decision: a tool with its critical arguments, or ``tool`` None (no call)."""

    tool: str | None
    arguments: dict[str, Match] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": {k: m.to_json() for k, m in self.arguments.items()}}


@dataclass(frozen=True)
class Case:
    id: str
    messages: tuple[dict[str, str], ...]
    expect: Expected | None  # None: not scored (a structured-output case only recorded)

    @property
    def negative(self) -> bool:
        return self.expect is not None and self.expect.tool is None


@dataclass(frozen=True)
class Suite:
    """A parsed, checked suite."""

    name: str
    provider: str
    model: str
    prompt_version: str
    contract: str
    cases: tuple[Case, ...]
    tools: tuple[dict[str, Any], ...] = ()
    response_format: dict[str, Any] | None = None
    alias: str | None = None  # the alias whose served-model change triggers the suite
    base_url: str | None = None
    api_key_env: str | None = None
    command: tuple[str, ...] = ()
    response_shape: str = "openai"  # whose raw response format the command prints
    concurrency: int = 4
    rate_per_second: float = 5.0
    max_attempts: int = 4
    timeout_seconds: float = 60.0
    max_tokens: int = 1024
    thresholds: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))

    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset(t["name"] for t in self.tools)


def load_suite(path: Path) -> Suite:
    """Read and check a suite file."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise SuiteInvalid(str(path), f"cannot be read: {exc.strerror or exc}") from None
    if size > MAX_SUITE_BYTES:
        raise SuiteInvalid(str(path), f"is {size} bytes; a suite is at most {MAX_SUITE_BYTES}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteInvalid(str(path), f"cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SuiteInvalid(str(path), f"is not valid TOML: {exc}") from None
    return parse_suite(data)


_TOP = {
    "name": True,
    "provider": True,
    "model": True,
    "prompt_version": True,
    "contract": True,
    "allow_alias": False,
    "alias": False,
    "base_url": False,
    "api_key_env": False,
    "command": False,
    "response_shape": False,
    "concurrency": False,
    "rate_per_second": False,
    "max_attempts": False,
    "timeout_seconds": False,
    "max_tokens": False,
    "thresholds": False,
    "tools": False,
    "response_format": False,
    "cases": True,
}


def parse_suite(data: Mapping[str, Any]) -> Suite:
    """A suite from a parsed TOML document; refusals name the key."""
    for key in data:
        if key not in _TOP:
            raise SuiteInvalid(key, f"unknown key; known keys are {', '.join(sorted(_TOP))}")
    for key, required in _TOP.items():
        if required and key not in data:
            raise SuiteInvalid(key, "is required")
    name = _name(data["name"], "name")
    provider = data["provider"]
    if provider not in PROVIDERS:
        raise SuiteInvalid("provider", f"{_shown(provider)} is not one of {', '.join(PROVIDERS)}")
    model = _name(data["model"], "model")
    allow_alias = data.get("allow_alias", False)
    if not isinstance(allow_alias, bool):
        raise SuiteInvalid("allow_alias", "must be true or false")
    if is_unpinned(model) and not allow_alias:
        raise SuiteInvalid(
            "model",
            f"{model!r} is an alias (no dated snapshot): the model behind it can change between runs; "
            "pin a dated version, or set allow_alias = true",
        )
    tools = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(_list(data.get("tools", []), "tools", MAX_TOOLS)))
    names = [t["name"] for t in tools]
    if len(set(names)) != len(names):
        raise SuiteInvalid("tools", "two tools share a name")
    response_format = data.get("response_format")
    if response_format is not None and not isinstance(response_format, dict):
        raise SuiteInvalid("response_format", "must be a table (a JSON Schema)")
    contract = _name(data["contract"], "contract")
    cases = tuple(
        _case(c, f"cases[{i}]", frozenset(names))
        for i, c in enumerate(_list(data["cases"], "cases", MAX_CASES, minimum=1))
    )
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise SuiteInvalid("cases", f"two cases share the id {dup!r}")
    command = data.get("command", [])
    if provider == "command":
        if not isinstance(command, list) or not command or not all(isinstance(x, str) and x for x in command):
            raise SuiteInvalid("command", 'must be the program and its arguments, e.g. ["python", "call.py"]')
    elif command:
        raise SuiteInvalid("command", f"is for the command provider, not {provider}")
    response_shape = data.get("response_shape", "openai")
    if response_shape not in PROVIDERS[:3]:
        raise SuiteInvalid("response_shape", f"{_shown(response_shape)} is not one of {', '.join(PROVIDERS[:3])}")
    if tools and contract in names:
        raise SuiteInvalid(
            "contract", f"{contract!r} is also a tool's name: a tool call and a structured output would mix"
        )
    base_url = data.get("base_url")
    if base_url is not None and (not isinstance(base_url, str) or not re.match(r"https?://[^\s]+$", base_url)):
        raise SuiteInvalid("base_url", "must be an http:// or https:// URL")
    api_key_env = data.get("api_key_env")
    if api_key_env is not None and (not isinstance(api_key_env, str) or not _ENV.fullmatch(api_key_env)):
        raise SuiteInvalid("api_key_env", "must name an environment variable (A-Z, 0-9, _), e.g. OPENAI_API_KEY")
    return Suite(
        name=name,
        provider=provider,
        model=model,
        prompt_version=_name(data["prompt_version"], "prompt_version"),
        contract=contract,
        cases=cases,
        tools=tools,
        response_format=response_format,
        alias=_name(data["alias"], "alias") if "alias" in data else None,
        base_url=base_url.rstrip("/") if base_url else None,
        api_key_env=api_key_env,
        command=tuple(command),
        response_shape=response_shape,
        concurrency=int(_number(data.get("concurrency", 4), "concurrency", 1, 32, integer=True)),
        rate_per_second=_number(data.get("rate_per_second", 5.0), "rate_per_second", 0.01, 1000),
        max_attempts=int(_number(data.get("max_attempts", 4), "max_attempts", 1, 10, integer=True)),
        timeout_seconds=_number(data.get("timeout_seconds", 60), "timeout_seconds", 0.1, 600),
        max_tokens=int(_number(data.get("max_tokens", 1024), "max_tokens", 1, 200_000, integer=True)),
        thresholds=_thresholds(data.get("thresholds", {})),
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def _name(value: Any, key: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise SuiteInvalid(
            key,
            f"{_shown(value)} is not a name: 1 to {MAX_NAME} letters, digits and . _ : @ / -, not starting with one",
        )
    return value


def _list(value: Any, key: str, maximum: int, *, minimum: int = 0) -> list[Any]:
    if not isinstance(value, list):
        raise SuiteInvalid(key, "must be an array of tables")
    if not minimum <= len(value) <= maximum:
        raise SuiteInvalid(key, f"has {len(value)} entries; {minimum} to {maximum} are allowed")
    return value


def _number(value: Any, key: str, low: float, high: float, *, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        raise SuiteInvalid(key, f"must be {'an integer' if integer else 'a number'}, got {_shown(value)}")
    if not (low <= value <= high) or (isinstance(value, float) and not math.isfinite(value)):
        raise SuiteInvalid(key, f"{value} is out of range; {low:g} to {high:g}")
    return float(value)


def _thresholds(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise SuiteInvalid("thresholds", "must be a table")
    out = dict(DEFAULT_THRESHOLDS)
    for k, v in value.items():
        if k not in DEFAULT_THRESHOLDS:
            raise SuiteInvalid(f"thresholds.{k}", f"unknown score; known: {', '.join(DEFAULT_THRESHOLDS)}")
        out[k] = _number(v, f"thresholds.{k}", 0.0, 1.0)
    return out


def _tool(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SuiteInvalid(key, "must be a table with name, description and parameters")
    unknown = set(value) - {"name", "description", "parameters"}
    if unknown:
        raise SuiteInvalid(f"{key}.{sorted(unknown)[0]}", "unknown key; known: name, description, parameters")
    name = value.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise SuiteInvalid(f"{key}.name", "must be 1 to 64 letters, digits, _ or - (what every provider accepts)")
    description = value.get("description", "")
    if not isinstance(description, str):
        raise SuiteInvalid(f"{key}.description", "must be a string")
    parameters = value.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise SuiteInvalid(f"{key}.parameters", 'must be a JSON Schema table of type "object"')
    return {"name": name, "description": description, "parameters": parameters}


def _case(value: Any, key: str, tools: frozenset[str]) -> Case:
    if not isinstance(value, dict):
        raise SuiteInvalid(key, "must be a table with id, messages and expect")
    unknown = set(value) - {"id", "messages", "expect"}
    if unknown:
        raise SuiteInvalid(f"{key}.{sorted(unknown)[0]}", "unknown key; known: id, messages, expect")
    case_id = _name(value.get("id"), f"{key}.id")
    messages = []
    for j, m in enumerate(_list(value.get("messages"), f"{key}.messages", MAX_MESSAGES, minimum=1)):
        where = f"{key}.messages[{j}]"
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise SuiteInvalid(where, "must be a table with role and content")
        if m["role"] not in _ROLES:
            raise SuiteInvalid(f"{where}.role", f"{_shown(m['role'])} is not one of {', '.join(_ROLES)}")
        if not isinstance(m["content"], str) or not m["content"]:
            raise SuiteInvalid(f"{where}.content", "must be a non-empty string")
        messages.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "user" for m in messages):
        raise SuiteInvalid(f"{key}.messages", "needs a user message")
    expect = value.get("expect")
    return Case(case_id, tuple(messages), None if expect is None else _expected(expect, f"{key}.expect", tools))


def _expected(value: Any, key: str, tools: frozenset[str]) -> Expected:
    if not isinstance(value, dict):
        raise SuiteInvalid(key, 'must be a table: tool = "name" (with arguments), or no_tool = true')
    unknown = set(value) - {"tool", "arguments", "no_tool"}
    if unknown:
        raise SuiteInvalid(f"{key}.{sorted(unknown)[0]}", "unknown key; known: tool, arguments, no_tool")
    if value.get("no_tool") is True:
        if "tool" in value or "arguments" in value:
            raise SuiteInvalid(key, "no_tool = true takes no tool and no arguments")
        return Expected(None)
    if "no_tool" in value:
        raise SuiteInvalid(f"{key}.no_tool", "must be true when given (omit it to expect a tool)")
    tool = value.get("tool")
    if tool not in tools:
        raise SuiteInvalid(
            f"{key}.tool", f"{_shown(tool)} is not a tool of the suite ({', '.join(sorted(tools)) or 'none'})"
        )
    args = value.get("arguments", {})
    if not isinstance(args, dict):
        raise SuiteInvalid(f"{key}.arguments", "must be a table: argument = value or { rule = value }")
    return Expected(tool, {name: _match(rule, f"{key}.arguments.{name}") for name, rule in args.items()})


def _match(value: Any, key: str) -> Match:
    if not isinstance(value, dict):
        return Match("exact", value)
    rules = set(value) - {"tolerance"}
    if len(rules) != 1 or not rules <= {"exact", "one_of", "number", "case_insensitive"}:
        raise SuiteInvalid(key, "must hold one rule: exact, one_of, number (with tolerance) or case_insensitive")
    rule = rules.pop()
    if "tolerance" in value and rule != "number":
        raise SuiteInvalid(f"{key}.tolerance", "goes with number only")
    v = value[rule]
    if rule == "one_of" and (not isinstance(v, list) or not v):
        raise SuiteInvalid(f"{key}.one_of", "must be a non-empty array of values")
    if rule == "number":
        num = _number(v, f"{key}.number", -1e300, 1e300)
        return Match("number", num, _number(value.get("tolerance", 0.0), f"{key}.tolerance", 0.0, 1e300))
    if rule == "case_insensitive" and not isinstance(v, str):
        raise SuiteInvalid(f"{key}.case_insensitive", "must be a string")
    return Match(rule, v)


# --- mined cases as suite cases ------------------------------------------------------------------


def suite_case(mined: Mapping[str, Any]) -> dict[str, Any] | None:
    """A mined probe case (``analysis/cases.py``) as a case of this format: its messages' text
    (GenAI ``parts`` joined), and the expected first decision with every argument matched exactly.
    None when the run's input was not captured (no user message to replay)."""
    messages = []
    for m in mined.get("messages") or []:
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            continue  # tool results and other roles are not input a suite replays
        if isinstance(m.get("content"), str):
            text = m["content"]
        else:
            raw = m.get("parts")
            parts: list[Any] = raw if isinstance(raw, list) else []
            text = "\n".join(
                p["content"]
                for p in parts
                if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("content"), str)
            )
        if text:
            messages.append({"role": m["role"], "content": text})
    if not any(m["role"] == "user" for m in messages):
        return None
    wanted = mined.get("expect") or {}
    if wanted.get("no_tool") or not wanted.get("tool"):
        expect: dict[str, Any] = {"no_tool": True}
    else:
        given = wanted.get("arguments")
        args: dict[str, Any] = given if isinstance(given, dict) else {}
        # TOML has no null: an argument expected to be null is left out of the match
        expect = {"tool": wanted["tool"], "arguments": {k: {"exact": v} for k, v in args.items() if v is not None}}
    return {"id": str(mined.get("id") or "case"), "messages": messages, "expect": expect}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return orjson_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        items = ", ".join(f"{orjson_str(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None)
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def orjson_str(s: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's (\\uXXXX, \\n, \\", \\\\)."""
    import json

    return json.dumps(s, ensure_ascii=True)


def suite_case_toml(case: Mapping[str, Any]) -> str:
    """A suite case as a ``[[cases]]`` table to paste into a suite file."""
    return (
        "[[cases]]\n"
        f"id = {orjson_str(str(case['id']))}\n"
        f"messages = {_toml_value(list(case['messages']))}\n"
        f"expect = {_toml_value(dict(case['expect']))}\n"
    )
