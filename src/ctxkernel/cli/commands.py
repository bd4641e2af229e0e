"""Core subcommands: plugins, profiles, validate, inspect, compact, strategy, run.

Exit codes are shared by every command: 0 success, 1 invalid (a failed check, a model error),
2 usage error (bad arguments, a profile or session that does not exist).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from ..controls import MANUAL_ACTIONS
from ..errors import ConfigError, ControlError, CtxKernelError, ProfileError, SessionBusyError, SessionNotFoundError
from ..exits import printable
from ..lineage import lineage
from ..plugins import StrategyManager
from ..profile import Profile, find_profile, list_profiles, load_profile, profile_search_path
from ..redact import redact
from .main import EXIT_INVALID, EXIT_OK, EXIT_USAGE, bounded_int, dump_json, file_in_the_way, one_line


def register(sub: Any) -> None:
    p = sub.add_parser("plugins", help="list installed strategies as JSON")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("profiles", help="list the profiles found on the profile search path")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_profiles)

    p = sub.add_parser(
        "validate",
        help="check profiles before running them (exit 0 valid, 1 invalid, 2 usage error)",
        description="Validate profiles by name or path; with none, every profile `ctxkernel profiles` lists.",
    )
    p.add_argument("profiles", nargs="*", metavar="PROFILE|PATH")
    p.add_argument("--json", action="store_true", help="print JSON rows (profile, check, level, strategy, message)")
    p.add_argument("--strict", action="store_true", help="treat warnings as failures")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("inspect", help="show a session's pressure, surface, compactions and strategy panels")
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--profile", help="profile to open the session with (default: the one recorded in the session)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "compact",
        help="compact a session now, by hand, in its strategies' own terms",
        description=(
            "Ask the session's enabled strategies to compact now (basic: summarise; decay: a checkpoint before the "
            "current turn; handoff, rollover: switch windows; chapters: continue in a new session, or --action "
            "archive to archive in place). Refused while the session is mid-step. Exit 0 when something was "
            "compacted, 1 when nothing was or the session is busy, 2 on a usage error."
        ),
    )
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--profile", help="profile to open the session with (default: the one recorded in the session)")
    p.add_argument("--action", default="compact", choices=list(MANUAL_ACTIONS), help="what to do (default compact)")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=cmd_compact)

    p = sub.add_parser(
        "strategy",
        help="enable or disable a strategy for one session (recorded in its log)",
        description=(
            "Enable or disable a strategy of the session's profile for that session only. The change is written "
            "to the session's log: a running harness picks it up at its next step, and it survives a restart."
        ),
    )
    p.add_argument("toggle", choices=["enable", "disable"])
    p.add_argument("name", metavar="NAME", help="a strategy of the session's profile")
    p.add_argument("--session", required=True, metavar="ID")
    p.add_argument("--profile", help="profile to open the session with (default: the one recorded in the session)")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=cmd_strategy)

    p = sub.add_parser(
        "export",
        help="write a session's strategy files (chapters, artifacts, handoff notes, audit) to a folder",
        description=(
            "Strategies keep their files in the store. Export writes one session's files under DIR as the "
            "seeds lay them out (chapters/<root>/chapters/*.md and artifacts/, handoff/handoff.md and "
            "handoff-log.md, decay/audit.jsonl), each read back and checked by sha256, and prints what it wrote. "
            "DIR must be outside the store's folder."
        ),
    )
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--to", required=True, metavar="DIR", help="target folder (created if missing)")
    p.add_argument("--profile", help="profile to open the session with (default: the one recorded in the session)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "run",
        help="run one agent turn with a model adapter",
        description=(
            "Run one turn of an AgentLoop. MODEL is scripted:<file.json> (a JSON list of replies: strings or "
            "OpenAI assistant messages) or openai:<base_url>#<model> (the key is read from --api-key-env)."
        ),
    )
    p.add_argument("prompt", nargs="*", help="the user's message (default: read stdin)")
    p.add_argument("--profile", help="profile name or path (default: $CTXKERNEL_PROFILE or basic)")
    p.add_argument("--model", required=True, metavar="MODEL")
    p.add_argument("--session", help="continue this session instead of starting a new one")
    p.add_argument(
        "--max-steps",
        type=bounded_int(1, 10_000),
        default=50,
        help="model steps before the turn is cut off (default 50)",
    )
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="variable holding the API key (openai:)")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=cmd_run)


def usage_error(command: str, message: str) -> int:
    sys.stderr.write(f"ctxkernel {command}: error: {one_line(redact(message))}\n")
    return EXIT_USAGE


def failure(command: str, message: str) -> int:
    sys.stderr.write(f"ctxkernel {command}: {redact(message)}\n")
    return EXIT_INVALID


# -- plugins ----------------------------------------------------------------------------------------
def cmd_plugins(args: argparse.Namespace) -> int:
    from ..validate import throwaway_session, tools_by_strategy

    discovered = StrategyManager()
    rows: list[dict[str, Any]] = []
    status = EXIT_OK
    for name, offers in sorted(discovered.conflicts.items()):
        status = EXIT_INVALID
        for available in offers:
            rows.append(
                {
                    "name": name,
                    "distribution": available.distribution,
                    "version": available.version,
                    "error": f"strategy name {name!r} is offered by {[a.distribution for a in offers]}; uninstall all but one",
                }
            )
    for name, available in sorted(discovered.available.items()):
        row: dict[str, Any] = {"name": name, "distribution": available.distribution, "version": available.version}
        # one manager per strategy: their tools are listed apart, so two strategies that share a
        # tool name (which no profile may combine) still each show their own
        manager = StrategyManager()
        try:
            spec = manager.register(
                available.load(), name, distribution=available.distribution, version=available.version
            )
            row |= {
                "description": spec.description,
                "hooks": manager.hook_names(name),
                "capabilities": sorted(spec.capabilities),
            }
            profile = Profile()
            profile.profile.strategies = [name]
            with tempfile.TemporaryDirectory(prefix="ctxkernel-plugins-") as tmp:
                session = throwaway_session(profile, manager, Path(tmp))
                row["tools"] = sorted(tools_by_strategy(manager, session).get(name, []))
                session.store.close()
        except Exception as exc:  # a broken plugin is listed with its error, not fatal
            status = EXIT_INVALID
            row["error"] = redact(f"{type(exc).__name__}: {exc}")
        rows.append(row)
    dump_json(rows)
    return status


# -- profiles ---------------------------------------------------------------------------------------
def cmd_profiles(args: argparse.Namespace) -> int:
    rows = []
    for name, path in sorted(list_profiles().items()):
        row: dict[str, Any] = {"name": name, "path": str(path)}
        try:
            profile = load_profile(path)
            row |= {"description": profile.profile.description, "strategies": profile.profile.strategies}
        except ProfileError as exc:
            row |= {"description": "", "strategies": [], "error": redact(str(exc).splitlines()[0])}
        rows.append(row)
    if args.json:
        dump_json(rows)
        return EXIT_OK
    if not rows:
        searched = ", ".join(str(p) for p in profile_search_path())
        sys.stdout.write(f"no profiles found (searched {searched})\n")
        return EXIT_OK
    # a profile's own text (its file name and description) reaches the terminal escaped
    shown = [(printable(r["name"]), printable(r["path"]), r) for r in rows]
    width = max(len(stem) for stem, _, _ in shown)
    pwidth = max(len(where) for _, where, _ in shown)
    for stem, where, r in shown:
        text = printable(r["description"] if "error" not in r else f"INVALID: {r['error']}")
        sys.stdout.write(f"{stem:<{width}}  {where:<{pwidth}}  {text}\n")
    return EXIT_OK


# -- validate ---------------------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    from ..validate import validate_profile

    targets = list(args.profiles)
    if not targets:
        targets = [str(p) for _, p in sorted(list_profiles().items())]
        if not targets:
            searched = ", ".join(str(p) for p in profile_search_path())
            return usage_error(
                "validate", f"no profile given and none found (searched {searched}); pass PROFILE or PATH"
            )
    # a name or path that does not exist is a usage error, told before any check runs
    for target in targets:
        try:
            found = find_profile(target)
        except ProfileError as exc:
            return usage_error("validate", str(exc))
        if found is None and target != "basic":
            known = sorted(list_profiles())
            return usage_error(
                "validate", f"no profile named {target!r}; known profiles: {known}; or pass a path to a .toml file"
            )
    reports = [validate_profile(t, strict=args.strict) for t in targets]
    if args.json:
        dump_json([{"profile": r.where, **row} for r in reports for row in r.rows()])
    else:
        for report in reports:
            _print_report(report)
    return EXIT_OK if all(r.valid for r in reports) else EXIT_INVALID


def _print_report(report: Any) -> None:
    fails, warns = len(report.failures), len(report.warnings)
    verdict = "valid" if report.valid else "INVALID"
    out = sys.stdout
    out.write(f"{printable(report.where)}: {verdict} ({fails} failed, {warns} warnings, {len(report.checks)} checks)\n")
    rows = [
        (c.check, c.level.upper() if c.level != "pass" else "pass", printable(c.strategy or "-"), printable(c.message))
        for c in report.checks
    ]
    widths = [max(len(r[i]) for r in [("check", "level", "strategy", ""), *rows]) for i in range(3)]
    out.write(f"  {'check':<{widths[0]}}  {'level':<{widths[1]}}  {'strategy':<{widths[2]}}  message\n")
    for check, level, strategy, message in rows:
        out.write(f"  {check:<{widths[0]}}  {level:<{widths[1]}}  {strategy:<{widths[2]}}  {message}\n")


# -- inspect ----------------------------------------------------------------------------------------
def _kernel_for(profile_name: str | None) -> Any:
    from ..kernel import Kernel

    return Kernel.from_profile(profile_name)


def _open_recorded(command: str, session_id: str, profile: str | None) -> tuple[Any, str] | int:
    """The session opened read-only, with ``--profile`` or else the profile it was recorded
    with, and where that profile came from; an exit status when it cannot be opened."""
    from ..store.base import check_session_id

    try:
        check_session_id(session_id)
    except CtxKernelError as exc:
        return usage_error(command, str(exc))
    try:
        kernel = _kernel_for(profile)
        recorded = kernel.store.header(session_id).profile if kernel.store.exists(session_id) else None
        source = "--profile" if profile is not None else "default"
        if profile is None and recorded and recorded != kernel.profile.name:
            # the session's strategies (and their panels) come from the profile it was written
            # with: use that one, or refuse; a guess would show another strategy's view
            found = list_profiles()
            if recorded not in found:
                searched = [str(p) for p in profile_search_path()]
                return usage_error(
                    command,
                    f"session {session_id} was recorded with profile {recorded!r}, which is not on the "
                    f"profile search path (found {sorted(found)} in {searched}). Fix: pass --profile with "
                    "that profile's name or .toml path (or another profile to read the session with)",
                )
            kernel = _kernel_for(str(found[recorded]))  # by its path: a recorded name is never a path
        if profile is None:
            source = "recorded with the session" if recorded else "default: the session records no profile"
        elif recorded and recorded != kernel.profile.name:
            sys.stderr.write(
                f"ctxkernel {command}: note: session recorded with profile {one_line(recorded)!r}; "
                f"read with {kernel.profile.name!r} ({source})\n"
            )
        # only reads: no crash repair, which would append closing events
        return kernel.open_session(session_id, repair=False), source
    except SessionNotFoundError as exc:
        where = getattr(kernel.store, "home", None) or kernel.store.backend
        return usage_error(
            command, f"{exc} (store at {where}); list sessions with the store's home or CTXKERNEL_HOME set"
        )
    except ProfileError as exc:
        return usage_error(command, str(exc))
    except CtxKernelError as exc:
        return failure(command, f"error: {exc}")


def cmd_inspect(args: argparse.Namespace) -> int:
    opened = _open_recorded("inspect", args.session, args.profile)
    if isinstance(opened, int):
        return opened
    session, source = opened
    view = session.project()
    view["profile"] = session.kernel.profile.name
    view.update(lineage(session, view.get("strategies")))
    if args.json:
        dump_json(view)  # the same view the web inspector serves (the source is on stderr when it differs)
        return EXIT_OK
    _print_inspect(view, source)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from ..store.export import write_export

    opened = _open_recorded("export", args.session, args.profile)
    if isinstance(opened, int):
        return opened
    session, _ = opened
    target = Path(args.to).expanduser()
    home = getattr(session.kernel.store, "home", None)
    if home is not None:
        # the store's own folder (sessions, blobs, key-value entries): an export there adds files to the store
        inside, root = target.resolve(), Path(home).expanduser().resolve()
        if inside == root or root in inside.parents:
            return usage_error(
                "export", f"--to {args.to} is inside the store's folder {root}; accepted: a folder outside it"
            )
    blocker = file_in_the_way(target)
    if blocker is not None:
        return usage_error(
            "export",
            f"--to {args.to}: {blocker} is a file, not a folder; accepted: a folder, or a path where one can be "
            "created (under folders only)",
        )
    try:
        files = session.kernel.hooks.export_files(session)
        written = write_export(target, files)
    except CtxKernelError as exc:
        return failure("export", f"error: {exc}")
    rows: list[dict[str, Any]] = [
        {"path": f.path, "strategy": f.strategy, "bytes": f.size, "sha256": f.sha256} for f in written
    ]
    if args.json:
        dump_json({"session": session.id, "to": str(target), "files": rows})
        return EXIT_OK
    out = sys.stdout
    out.write(f"exported {len(rows)} file(s) of session {session.id} to {args.to} (each verified by sha256)\n")
    for row in rows:
        out.write(f"  {row['path']}  {row['bytes']} bytes  {row['sha256'][:16]}\n")
    return EXIT_OK


def _print_inspect(view: dict[str, Any], source: str) -> None:
    out = sys.stdout
    p = view["pressure"]
    profile = f"profile {view['profile']} ({source})"
    out.write(f"session {view['session']}  ({profile}, {view['events']} events, turn {view['turn']})\n")
    if view.get("origin"):
        out.write(f"origin    {view['origin']}\n")
    if view.get("parent"):
        out.write(f"continues {view['parent']}\n")
    anchored = "anchored on provider usage" if p["anchored"] else "estimated"
    out.write(
        f"pressure  {p['tokens']} / {p['effective_window']} tokens ({p['ratio']:.1%}, {anchored}); "
        f"window {p['context_window']}, reserved output {p['reserved_output_tokens']}\n"
    )
    s = view["surface"]
    roles = ", ".join(f"{n} {role}" for role, n in sorted(s["roles"].items()))
    out.write(f"surface   {s['nodes']} messages ({roles or 'empty'}), {s['tokens']} tokens\n")
    cache = view.get("cache") or {}
    if cache.get("prefix_tokens") is not None:
        out.write(
            f"cache     the last request (turn {cache['turn']}, step {cache['step']}) repeats "
            f"{cache['prefix_tokens']} tokens of the previous one's prefix\n"
        )
    compactions = view["compactions"]
    out.write(f"compactions  {len(compactions)}\n")
    for i, c in enumerate(compactions, 1):
        out.write(
            f"  {i}. {c['strategy']}/{c['kind']}: {c['tokens_before']} -> {c['tokens_after']} tokens, {c['cites']} messages replaced\n"
        )
    for name, panel in view["strategies"].items():
        out.write(f"[{name}]\n")
        for key, value in panel.items():
            text = value if isinstance(value, str) else orjson.dumps(value).decode()
            out.write(f"  {key}: {text}\n")


# -- manual controls ------------------------------------------------------------------------------------
def cmd_compact(args: argparse.Namespace) -> int:
    opened = _open_recorded("compact", args.session, args.profile)
    if isinstance(opened, int):
        return opened
    session, _ = opened
    try:
        outcome = session.compact_now(args.action, by="cli")
    except SessionBusyError as exc:
        return failure("compact", f"busy: {exc}")
    except ControlError as exc:
        return usage_error("compact", str(exc))
    except CtxKernelError as exc:
        return failure("compact", f"{type(exc).__name__}: {exc}")
    view = {"session": session.id, "action": args.action, **outcome.to_dict()}
    if args.json:
        dump_json(view)
    else:
        state = "compacted" if outcome.committed else "nothing compacted"
        sys.stdout.write(
            f"{state} by {outcome.strategy}: {outcome.detail} "
            f"({outcome.tokens_before} -> {outcome.tokens_after} prompt tokens)\n"
        )
    return EXIT_OK if outcome.committed else EXIT_INVALID


def cmd_strategy(args: argparse.Namespace) -> int:
    opened = _open_recorded("strategy", args.session, args.profile)
    if isinstance(opened, int):
        return opened
    session, _ = opened
    enabled = args.toggle == "enable"
    try:
        changed = session.set_strategy_enabled(args.name, enabled, by="cli")
    except SessionBusyError as exc:
        return failure("strategy", f"busy: {exc}")
    except ControlError as exc:
        return usage_error("strategy", str(exc))
    except CtxKernelError as exc:
        return failure("strategy", f"{type(exc).__name__}: {exc}")
    view = {
        "session": session.id,
        "strategy": args.name,
        "enabled": enabled,
        "changed": changed,
        "enabled_strategies": session.enabled_strategies(),
    }
    if args.json:
        dump_json(view)
    else:
        already = "" if changed else " (already)"
        sys.stdout.write(
            f"{args.name} {'enabled' if enabled else 'disabled'}{already} for session {session.id}; "
            f"running: {', '.join(view['enabled_strategies']) or 'none'}\n"
        )
    return EXIT_OK


# -- run ----------------------------------------------------------------------------------------------
def model_from_spec(spec: str, *, api_key_env: str = "OPENAI_API_KEY") -> Any:
    """``scripted:<file.json>`` or ``openai:<base_url>#<model>``; raises ValueError on bad usage."""
    scheme, sep, rest = spec.partition(":")
    if not sep or scheme not in ("scripted", "openai") or not rest:
        msg = f"--model {spec!r} is not understood; use scripted:<file.json> or openai:<base_url>#<model>"
        raise ValueError(msg)
    if scheme == "scripted":
        return _scripted_model(Path(rest))
    from ..models.openai_http import OpenAIChatModel, _provider_from_url

    base_url, hashmark, model = rest.partition("#")
    if not hashmark or not model or not base_url.startswith(("http://", "https://")):
        msg = f"--model {spec!r}: write openai:<base_url>#<model>, e.g. openai:http://127.0.0.1:8000/v1#qwen2.5"
        raise ValueError(msg)
    try:  # built here, before a session exists: a bad URL leaves the store untouched
        return OpenAIChatModel(
            model, base_url=base_url, api_key=os.environ.get(api_key_env) or None, provider=_provider_from_url(base_url)
        )
    except ConfigError as exc:  # the URL, already redacted in the message
        raise ValueError(f"--model: {exc}") from None


def _scripted_model(path: Path) -> Any:
    from ..convert import from_openai_message
    from ..messages import Message
    from ..models.scripted import ScriptedModel

    try:
        raw = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        msg = f"scripted model file {path} does not exist"
        raise ValueError(msg) from None
    except OSError as exc:
        msg = f"scripted model file {path} cannot be read ({exc.strerror or exc}); give a JSON file"
        raise ValueError(msg) from None
    except orjson.JSONDecodeError as exc:
        msg = f"scripted model file {path} is not JSON ({exc})"
        raise ValueError(msg) from None
    if not isinstance(raw, list) or not raw:
        msg = f"scripted model file {path} must hold a non-empty JSON list of replies (strings or assistant messages)"
        raise ValueError(msg)
    replies: list[Message | str] = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            replies.append(item)
        elif isinstance(item, dict):
            try:
                message = from_openai_message({"role": "assistant", **item}, where=f"{path}[{i}]")
            except CtxKernelError as exc:
                raise ValueError(str(exc)) from None
            if message is None or message.role != "assistant":
                msg = f"{path}[{i}]: a reply must be an assistant message"
                raise ValueError(msg)
            replies.append(message)
        else:
            msg = f"{path}[{i}]: a reply is a string or an object like {{'content': ..., 'tool_calls': [...]}}"
            raise ValueError(msg)
    return ScriptedModel(replies)


def cmd_run(args: argparse.Namespace) -> int:
    from ..errors import ModelError
    from ..loop import AgentLoop
    from ..store.base import check_session_id

    if args.session is not None:
        try:
            check_session_id(args.session)
        except CtxKernelError as exc:
            return usage_error("run", f"--session: {exc}")
    prompt = " ".join(args.prompt).strip()
    if not prompt or prompt == "-":
        prompt = sys.stdin.read().strip()
    if not prompt:
        return usage_error("run", "no prompt: pass it as arguments or on stdin")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:  # undecodable bytes reach Python as lone surrogates
        return usage_error("run", f"the prompt is not UTF-8 text (character {exc.start}); pass UTF-8 text")
    try:
        model = model_from_spec(args.model, api_key_env=args.api_key_env)
    except ValueError as exc:
        return usage_error("run", str(exc))
    try:
        kernel = _kernel_for(args.profile)
    except ProfileError as exc:
        return usage_error("run", str(exc))
    except CtxKernelError as exc:
        return failure("run", f"error: {exc}")
    try:
        session = kernel.open_session(args.session) if args.session else kernel.open_session()
    except SessionNotFoundError as exc:
        return usage_error("run", str(exc))
    if model.provider != "scripted":
        # route to the model actually called, so its per-model policy applies
        session.set_route(model.provider, model.model)
    sys.stderr.write(f"session {session.id}\n")
    try:
        result = AgentLoop(session, model, max_steps=args.max_steps).run(prompt)
    except ModelError as exc:
        return failure("run", f"model error: {exc} (session {session.id})")
    if args.json:
        dump_json(
            {
                "session": session.id,
                "reason": result.reason,
                "steps": result.steps,
                "retries": result.retries,
                "text": result.text,
                "pressure": session.pressure().to_dict(),
            }
        )
    else:
        sys.stdout.write(result.text + ("\n" if not result.text.endswith("\n") else ""))
    return EXIT_OK if result.reason == "completed" else EXIT_INVALID
