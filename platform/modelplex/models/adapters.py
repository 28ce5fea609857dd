"""LoRA adapters, the host's side: names, where adapter files may come from, and the set of adapters
loaded into every instance of one model version.

Backend-neutral. The host checks an adapter's name like a model name, confines its folder to the
allowed roots (`--lora-adapter-root` and the model's own `adapters/`), then calls each instance's
`load_adapter` / `unload_adapter` (see `ModelInstance`). A request picks an adapter with the request
parameter `lora`; the OpenAI routes also accept an adapter's name as `model`. What an adapter folder
holds (PEFT files) is the backend's business (`modelplex_multilora.peft` reads and checks it).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..core.backend import ModelContext, ModelInstance
from ..core.errors import InvalidInput, ModelplexError, NotFound, Unsupported
from .repository import check_name

log = logging.getLogger(__name__)

LORA_PARAMETER = "lora"  # request parameter naming the adapter
STATIC_FOLDER = "adapters"  # <model>/adapters/<name>/ load with the model
MODULES_PARAMETER = "lora_modules"  # config.pbtxt parameter: "name=path[,name=path...]"


@dataclass(frozen=True)
class AdapterSource:
    """An adapter to load: its name, its folder (resolved, inside an allowed root) and where the
    request for it came from: `static` (the model's folder or config) or `dynamic` (the API)."""

    name: str
    path: Path
    origin: str


def supports_adapters(instance: ModelInstance) -> bool:
    return type(instance).load_adapter is not ModelInstance.load_adapter


def allowed_roots(model_path: Path, roots: list[Path]) -> list[Path]:
    return [(model_path / STATIC_FOLDER).resolve()] + [Path(r).resolve() for r in roots]


def resolve_folder(name: str, source: str | None, model_path: Path, roots: list[Path],
                   base: Path | None = None) -> Path:
    """The adapter folder for `source` (None: `<model>/adapters/<name>`), symlinks resolved.

    A relative `source` is taken relative to `base` and refused when there is none (the APIs want
    absolute paths). Anything that resolves outside the allowed roots is refused, existing or not.
    """
    check_name(name, "adapter name")
    if source is None:
        path = model_path / STATIC_FOLDER / name
    elif not isinstance(source, str) or not source or "\x00" in source:
        raise InvalidInput(f"adapter '{name}': the source must be a folder path")
    elif Path(source).is_absolute():
        path = Path(source)
    elif base is not None:
        path = base / source
    else:
        raise InvalidInput(f"adapter '{name}': the source {source!r} must be an absolute path")
    resolved = path.resolve()
    if not any(resolved == root or root in resolved.parents for root in allowed_roots(model_path, roots)):
        raise InvalidInput(f"adapter '{name}': {source or path} is outside the allowed adapter folders (the "
                           f"model's {STATIC_FOLDER}/ folder and --lora-adapter-root)")
    if not resolved.is_dir():
        raise InvalidInput(f"adapter '{name}': no adapter folder at {source or path}")
    return resolved


def static_sources(ctx: ModelContext, roots: list[Path]) -> list[AdapterSource]:
    """Adapters that load with the model: every folder in `<model>/adapters/`, then the config's
    `lora_modules` parameter (`name=path`, a relative path taken from the model folder)."""
    found: dict[str, Path] = {}
    folder = ctx.model_path / STATIC_FOLDER
    if folder.is_dir():
        for entry in sorted(folder.iterdir()):
            if entry.is_dir() and not entry.name.startswith("."):
                found[entry.name] = resolve_folder(entry.name, None, ctx.model_path, roots)
    for item in filter(None, (s.strip() for s in ctx.parameters.get(MODULES_PARAMETER, "").split(","))):
        name, sep, source = (part.strip() for part in item.partition("="))
        if not sep or not name or not source:
            raise InvalidInput(f"model '{ctx.name}': parameter '{MODULES_PARAMETER}' expects name=path[,name=path], "
                               f"got {item!r}")
        if name in found:
            raise InvalidInput(f"model '{ctx.name}': adapter '{name}' is given twice")
        found[name] = resolve_folder(name, source, ctx.model_path, roots, base=ctx.model_path)
    return [AdapterSource(name, path, "static") for name, path in found.items()]


class ModelAdapters:
    """The adapters of one model version. Invariant: a name is in `sources` only while every
    instance has it loaded; an unload removes it first, so new requests for it are refused."""

    def __init__(self, model: str, instances: list[ModelInstance]):
        self.model, self.instances = model, instances
        self.sources: dict[str, AdapterSource] = {}

    @property
    def supported(self) -> bool:
        return bool(self.instances) and all(supports_adapters(i) for i in self.instances)

    def require_support(self) -> None:
        if not self.supported:
            raise Unsupported(f"model '{self.model}' does not serve LoRA adapters (its backend has no adapter "
                              "support)")

    async def load(self, source: AdapterSource) -> None:
        """Load into every instance, or into none: a failure unloads it from those that took it."""
        self.require_support()
        if source.name in self.sources:
            raise InvalidInput(f"adapter '{source.name}' is already loaded on model '{self.model}'; unload it first")
        done = []
        try:
            for instance in self.instances:
                await instance.load_adapter(source.name, source.path)
                done.append(instance)
        except BaseException:
            for instance in done:
                try:
                    await instance.unload_adapter(source.name)
                except Exception:
                    log.exception("model %s: undoing adapter %s failed", self.model, source.name)
            raise
        self.sources[source.name] = source

    async def unload(self, name: str) -> None:
        """Refuse new requests for `name` at once; return when every instance has let it go."""
        if self.sources.pop(name, None) is None:
            raise NotFound(f"model '{self.model}' has no adapter '{name}'")
        for instance in self.instances:
            await instance.unload_adapter(name)

    def check(self, name) -> None:
        """A request's `lora` parameter: a loaded adapter's name (or empty: the base model)."""
        if type(name) is not str:
            raise InvalidInput(f"parameter '{LORA_PARAMETER}' must be an adapter name (a string)")
        if name and name not in self.sources:
            raise NotFound(f"model '{self.model}' has no adapter '{name}'")

    def rows(self) -> list[dict]:
        """What the backend reports of each adapter (first instance), with the host's fields first."""
        reported = {}
        if self.supported:
            reported = {row["name"]: row for row in self.instances[0].list_adapters()}
        return [{"name": name, "model": self.model, "source": str(s.path), "origin": s.origin, "state": "READY"}
                | reported.get(name, {}) for name, s in sorted(self.sources.items())]


async def load_sources(adapters: ModelAdapters, sources: list[AdapterSource]) -> None:
    """Adapters that come with a model version: a bad static one fails the load (with its reason);
    a dynamic one carried over from the previous version is dropped with a warning."""
    for source in sources:
        try:
            await adapters.load(source)
        except ModelplexError as e:
            if source.origin == "static":
                raise InvalidInput(f"adapter '{source.name}' ({source.path}): {e.message}") from None
            log.warning("model %s: adapter %s (%s) not carried over to the new version: %s", adapters.model,
                        source.name, source.path, e.message)
