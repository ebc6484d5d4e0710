"""CI check: every HTTP verb our request handlers implement carries `@tornado.web.authenticated`.

Run as `scripts/check-auth` (exit 1 and one line per offender). It inspects the live
classes rather than the source text, so an aliased import or a verb inherited from a
base class is judged the same way: tornado's decorator wraps every method in one shared
wrapper function, whose code object is looked for along each method's `__wrapped__` chain.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from collections.abc import Iterable
from typing import Any

import tornado.web

_AUTH_WRAPPER_CODE = tornado.web.authenticated(lambda self: None).__code__  # type: ignore[arg-type]
VERBS = ("get", "head", "post", "put", "patch", "delete", "options")


def is_authenticated(method: Any) -> bool:
    """True when `method`, or any function it wraps, is tornado's `authenticated` wrapper."""
    seen = 0
    while method is not None and seen < 20:
        if getattr(method, "__code__", None) is _AUTH_WRAPPER_CODE:
            return True
        method, seen = getattr(method, "__wrapped__", None), seen + 1
    return False


def unauthenticated_verbs(handlers: Iterable[type[tornado.web.RequestHandler]], own: str = "workbench") -> list[str]:
    """'module.Class.verb' for each verb our code implements (in the class or a base of ours) without the decorator.

    Verbs inherited from tornado or jupyter_server are theirs to guard (APIHandler's CORS
    `options` is deliberately open); one that our code defines or overrides is ours.
    """
    offenders = []
    for cls in handlers:
        for verb in VERBS:
            owner = next((base for base in cls.__mro__ if verb in vars(base)), None)
            if owner is None or not owner.__module__.startswith(own):
                continue
            if not is_authenticated(getattr(cls, verb)):
                offenders.append(f"{cls.__module__}.{cls.__qualname__}.{verb}")
    return offenders


def package_handlers(package: str = "workbench.jupyter") -> list[type[tornado.web.RequestHandler]]:
    """Every RequestHandler subclass defined in `package` and its submodules, plus those in its ROUTES."""
    root = importlib.import_module(package)
    modules = [root] + [
        importlib.import_module(info.name) for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")
    ]
    found: dict[str, type[tornado.web.RequestHandler]] = {}
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, tornado.web.RequestHandler) and cls.__module__.startswith(package):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        for _, cls in getattr(module, "ROUTES", []):
            found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return list(found.values())


def main(argv: list[str] | None = None) -> int:
    packages = (argv if argv is not None else sys.argv[1:]) or ["workbench.jupyter"]
    handlers = [cls for package in packages for cls in package_handlers(package)]
    offenders = unauthenticated_verbs(handlers)
    for name in offenders:
        print(f"check-auth: {name} lacks @tornado.web.authenticated", file=sys.stderr)
    if not handlers:
        print(f"check-auth: no request handlers found in {', '.join(packages)}", file=sys.stderr)
        return 1
    if not offenders:
        print(f"check-auth: {len(handlers)} handlers, every verb authenticated")
    return 1 if offenders else 0


if __name__ == "__main__":
    raise SystemExit(main())
