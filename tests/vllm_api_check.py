"""Check the vLLM backend's calls against the source of the pinned vLLM release, without importing vllm.

What is checked (all derived from ``searchr1_lld/rollout/backends/vllm.py`` itself):
- every keyword the backend's builders may pass to ``LLM(...)`` and ``SamplingParams(...)`` (the ``VLLM_API``
  table the builders enforce): ``LLM.__init__`` parameters, or ``EngineArgs`` fields (``LLM`` forwards its
  ``**kwargs`` there); ``SamplingParams`` fields (a msgspec Struct: its annotated class attributes);
- every ``self.llm.<method>(...)`` call in the backend's source (parsed with ``ast``): the method exists on ``LLM``
  (or a base class), takes that many positional arguments and every keyword given; string literals passed in a
  list (``wake_up(tags=["weights"])``) appear in the method's source;
- every method called on the engine model inside ``self.llm.apply_model(lambda model: model.<m>(...))``: exists on
  the model classes we train (Qwen2ForCausalLM) with a compatible signature, and the worker has ``apply_model``;
- every worker method named in ``self.llm.collective_rpc("<method>", kwargs={...})``: exists on the GPU worker and
  takes the keywords given (followed to the model runner where the worker forwards ``**kwargs``);
- every attribute read as ``self.llm.<attr>.<member>``: ``<attr>`` is assigned in ``LLM.__init__`` and, for
  ``model_config``, ``<member>`` is a field or method of ``ModelConfig``;
- the names imported ``from vllm import ...`` are exported by the release's ``vllm/__init__.py``;
- the option strings of a built ``LLM`` keyword set (``build_llm_kwargs``) appear in the release's config modules.

The release's files come from its wheel on PyPI, read with HTTP range requests (the zip's central directory and
only the members needed: about 2 MB instead of ~340 MB) and cached under ``$SEARCHR1_LLD_CACHE`` (default
``~/.cache/searchr1-lld``)/vllm-<version>/. Zip member CRCs are verified by ``zipfile`` on every read.
"""

from __future__ import annotations

import ast
import io
import json
import os
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

PYPI_JSON = "https://pypi.org/pypi/vllm/json"  # the project's JSON (also served by mirrors that lack per-version pages)
FILES_HOST = "https://files.pythonhosted.org/packages/"
MODEL_CLASSES = [("vllm/model_executor/models/qwen2.py", "Qwen2ForCausalLM")]  # the architectures we train
WORKER_CLASS = ("vllm/v1/worker/worker_base.py", "WorkerBase")
GPU_WORKER_CLASS = ("vllm/v1/worker/gpu_worker.py", "Worker")  # the worker collective_rpc calls on a GPU
ATTRIBUTE_CLASSES = {"model_config": ("vllm/config/model.py", "ModelConfig")}  # LLM attribute -> its class
FORWARDED_KWARGS = {("vllm/entrypoints/llm.py", "LLM", "__init__"): ("vllm/engine/arg_utils.py", "EngineArgs")}
# worker methods that take (*args, **kwargs) and pass them on: where the keywords are really checked
FORWARDED_CALLS = {("vllm/v1/worker/gpu_worker.py", "Worker", "reload_weights"):
                   ("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner", "reload_weights")}
CONSTRUCTORS = {"LLM": "vllm.entrypoints.llm", "SamplingParams": "vllm.sampling_params"}


class ContractFetchError(RuntimeError):
    """The pinned release's files could not be obtained (PyPI unreachable, no wheel, ...)."""


def cache_root() -> Path:
    return Path(os.environ.get("SEARCHR1_LLD_CACHE", Path.home() / ".cache" / "searchr1-lld"))


class _HTTPRangeFile(io.RawIOBase):
    """A read-only seekable file over HTTP range requests, in 256 KiB blocks (what ``zipfile`` needs)."""

    BLOCK = 1 << 18

    def __init__(self, url: str, size: int, timeout: float = 60.0) -> None:
        self.url, self.size, self.timeout, self.pos = url, size, timeout, 0
        self.blocks: dict[int, bytes] = {}
        self.bytes_fetched = 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def _block(self, i: int) -> bytes:
        if i not in self.blocks:
            start, end = i * self.BLOCK, min(self.size, (i + 1) * self.BLOCK) - 1
            req = urllib.request.Request(self.url, headers={"Range": f"bytes={start}-{end}"})
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = resp.read()
            if len(data) != end - start + 1:
                raise ContractFetchError(f"range request {start}-{end} of {self.url} returned {len(data)} bytes")
            self.blocks[i] = data
            self.bytes_fetched += len(data)
        return self.blocks[i]

    def read(self, n: int = -1) -> bytes:
        if n < 0 or self.pos + n > self.size:
            n = max(0, self.size - self.pos)
        out = bytearray()
        while n > 0:
            i, off = divmod(self.pos, self.BLOCK)
            chunk = self._block(i)[off : off + n]
            out += chunk
            self.pos += len(chunk)
            n -= len(chunk)
        return bytes(out)


class PinnedRelease:
    """Source files of one vLLM release, read lazily from its wheel and cached on disk."""

    def __init__(self, version: str, cache_dir: Optional[Path] = None) -> None:
        self.version = version
        self.dir = (cache_dir or cache_root()) / f"vllm-{version}"
        self._zip: Optional[zipfile.ZipFile] = None
        self._names: Optional[set[str]] = None
        self._remote: Optional[_HTTPRangeFile] = None

    @property
    def bytes_fetched(self) -> int:
        return self._remote.bytes_fetched if self._remote else 0

    def _open(self) -> zipfile.ZipFile:
        if self._zip is None:
            try:
                with urllib.request.urlopen(PYPI_JSON, timeout=30) as resp:
                    files = json.load(resp)["releases"].get(self.version, [])
                wheels = [f for f in files if f["filename"].endswith(".whl")]
                if not wheels:
                    raise ContractFetchError(f"PyPI lists no wheel for vllm=={self.version}")
                wheel = next((f for f in wheels if "x86_64" in f["filename"]), wheels[0])
                url = wheel["url"]
                if not url.startswith(("https://", "http://")):  # a mirror's relative link to the same file tree
                    url = FILES_HOST + url.split("packages/")[-1]
                self._remote = _HTTPRangeFile(url, int(wheel["size"]))
                self._zip = zipfile.ZipFile(self._remote)
            except ContractFetchError:
                raise
            except Exception as err:  # network, HTTP, bad zip
                raise ContractFetchError(
                    f"cannot read the vllm=={self.version} wheel from PyPI ({type(err).__name__}: {err}); the vLLM "
                    f"API contract test needs network access to pypi.org once, then uses the cache in {self.dir}"
                ) from err
        return self._zip

    def names(self) -> set[str]:
        if self._names is None:
            listing = self.dir / "_names.txt"
            if listing.is_file():
                self._names = set(listing.read_text().split("\n"))
            else:
                self._names = set(self._open().namelist())
                self.dir.mkdir(parents=True, exist_ok=True)
                tmp = listing.with_suffix(".tmp")
                tmp.write_text("\n".join(sorted(self._names)))
                tmp.replace(listing)
        return self._names

    def read(self, path: str) -> str:
        cached = self.dir / path
        if not cached.is_file():
            if path not in self.names():
                raise FileNotFoundError(f"vllm=={self.version} has no file {path}")
            data = self._open().read(path)
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(cached.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(cached)
        return cached.read_text()

    def module_path(self, module: str) -> Optional[str]:
        base = module.replace(".", "/")
        for cand in (base + ".py", base + "/__init__.py"):
            if cand in self.names():
                return cand
        return None


# ----------------------------------------------------------------------------------------------- what the backend uses


@dataclass
class Use:
    """One use of the vLLM API: ``target`` is "LLM", "SamplingParams", "LLM.<method>", "model.<method>",
    "worker.<method>" (named in collective_rpc) or "attr.<attribute>.<member>" (``self.llm.<attribute>.<member>``)."""

    target: str
    n_positional: int = 0
    keywords: tuple[str, ...] = ()
    str_values: dict[str, list[str]] = field(default_factory=dict)  # keyword -> string literals passed in a list
    line: int = 0


def backend_uses(source: str, api_table: dict[str, tuple[str, ...]]) -> list[Use]:
    """Every vLLM use of the backend: the declared constructor keywords and each ``self.llm.<m>(...)`` call."""
    uses = [Use(name, 0, tuple(kws)) for name, kws in api_table.items()]
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr != "llm" \
                and _is_self_llm(node.value.value):
            uses.append(Use(f"attr.{node.value.attr}.{node.attr}", line=node.lineno))
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Attribute) and owner.attr == "llm" and isinstance(owner.value, ast.Name) \
                and owner.value.id == "self":
            values = {kw.arg: [e.value for e in kw.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                      for kw in node.keywords if kw.arg and isinstance(kw.value, (ast.List, ast.Tuple))}
            uses.append(Use(f"LLM.{node.func.attr}", len(node.args), tuple(kw.arg for kw in node.keywords if kw.arg),
                            values, node.lineno))
            if node.func.attr == "collective_rpc" and node.args and isinstance(node.args[0], ast.Constant):
                rpc_kwargs = next((kw.value for kw in node.keywords if kw.arg == "kwargs"), None)
                keys = tuple(k.value for k in rpc_kwargs.keys if isinstance(k, ast.Constant)) \
                    if isinstance(rpc_kwargs, ast.Dict) else ()
                uses.append(Use(f"worker.{node.args[0].value}", 0, keys, {}, node.lineno))
            if node.func.attr == "apply_model" and node.args and isinstance(node.args[0], ast.Lambda):
                lam = node.args[0]
                arg = lam.args.args[0].arg
                for inner in ast.walk(lam.body):
                    if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) \
                            and isinstance(inner.func.value, ast.Name) and inner.func.value.id == arg:
                        uses.append(Use(f"model.{inner.func.attr}", len(inner.args),
                                        tuple(kw.arg for kw in inner.keywords if kw.arg), {}, inner.lineno))
    return uses


def _is_self_llm(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "llm" and isinstance(node.value, ast.Name) \
        and node.value.id == "self"


def vllm_imports(source: str) -> list[str]:
    """Names the backend imports with ``from vllm import ...``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "vllm":
            names += [a.name for a in node.names]
    return names


# ----------------------------------------------------------------------------------------------- the release's side


@dataclass
class Signature:
    positional: list[str]  # positional-or-keyword (and positional-only) parameters, self excluded
    required: list[str]
    keyword_only: list[str]
    varargs: bool
    varkw: bool
    source: str


def _signature(fn: ast.FunctionDef, text: str) -> Signature:
    a = fn.args
    pos = [x.arg for x in a.posonlyargs + a.args]
    if pos and pos[0] in ("self", "cls"):
        pos = pos[1:]
    n_req = len(pos) - len(a.defaults)
    req = pos[:n_req] + [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    return Signature(pos, req, [x.arg for x in a.kwonlyargs], a.vararg is not None, a.kwarg is not None,
                     ast.get_source_segment(text, fn) or "")


class Release:
    """Classes and methods of the pinned release, found by parsing its files."""

    def __init__(self, files: PinnedRelease) -> None:
        self.files = files

    def _tree(self, path: str) -> tuple[ast.Module, str]:
        text = self.files.read(path)
        return ast.parse(text), text

    def find_class(self, path: str, name: str) -> tuple[ast.ClassDef, str, str]:
        tree, text = self._tree(path)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node, text, path
        for node in tree.body:  # re-exported: follow `from x import name`
            if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
                target = self.files.module_path(node.module)
                if target:
                    return self.find_class(target, name)
        raise LookupError(f"class {name} not found in {path}")

    def find_method(self, path: str, cls: str, method: str) -> Optional[tuple[Signature, str]]:
        node, text, where = self.find_class(path, cls)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method:
                return _signature(item, text), where
        tree, _ = self._tree(where)
        for base in node.bases:
            base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            if not base_name:
                continue
            base_path = where
            for imp in tree.body:
                if isinstance(imp, ast.ImportFrom) and imp.module and any(a.name == base_name for a in imp.names):
                    base_path = self.files.module_path(imp.module) or where
            try:
                found = self.find_method(base_path, base_name, method)
            except LookupError:
                continue
            if found:
                return found
        return None

    def fields(self, path: str, cls: str) -> set[str]:
        """Annotated class attributes (dataclass / msgspec fields), ClassVars excluded."""
        node, _, _ = self.find_class(path, cls)
        out = set()
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                if "ClassVar" not in ast.dump(item.annotation):
                    out.add(item.target.id)
        return out

    def exports(self) -> set[str]:
        """Names ``vllm/__init__.py`` makes importable (its lazy MODULE_ATTRS table and direct imports)."""
        tree, _ = self._tree("vllm/__init__.py")
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                    isinstance(t, ast.Name) and t.id == "MODULE_ATTRS" for t in node.targets):
                names |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
            elif isinstance(node, ast.ImportFrom):
                names |= {a.asname or a.name for a in node.names}
        return names


def _check_call(release: Release, path: str, cls: str, method: str, use: Use) -> list[str]:
    label = f"{cls}.{method}" if method != "__init__" else f"{cls}(...)"
    found = release.find_method(path, cls, method)
    if found is None:
        return [f"{label}: no such method in vllm=={release.files.version} (backend line {use.line})"]
    sig, _ = found
    errors = []
    if use.n_positional > len(sig.positional) and not sig.varargs:
        errors.append(f"{label}: {use.n_positional} positional arguments, the release takes {len(sig.positional)}")
    if (path, cls, method) in FORWARDED_CALLS:  # (*args, **kwargs) passed on: check where they land
        return _check_call(release, *FORWARDED_CALLS[(path, cls, method)], use)
    forwarded = FORWARDED_KWARGS.get((path, cls, method))
    fwd_fields = release.fields(*forwarded) if forwarded else set()
    for kw in use.keywords:
        if kw in sig.positional[use.n_positional:] or kw in sig.keyword_only:
            continue
        if forwarded and kw in fwd_fields:
            continue
        if sig.varkw and not forwarded:
            continue
        where = f" nor a field of {forwarded[1]}" if forwarded else ""
        errors.append(f"{label}: keyword {kw!r} is not a parameter{where} in vllm=={release.files.version}")
    given = set(sig.positional[: use.n_positional]) | set(use.keywords)
    missing = [p for p in sig.required if p not in given]
    if missing:
        errors.append(f"{label}: required parameters {missing} are not passed")
    for kw, values in use.str_values.items():
        for v in values:
            if f'"{v}"' not in sig.source and f"'{v}'" not in sig.source:
                errors.append(f"{label}: value {v!r} for {kw!r} is not mentioned by the release's {label}")
    return errors


def _check_attribute(release: Release, llm_path: str, use: Use) -> list[str]:
    """``self.llm.<attr>.<member>``: LLM.__init__ assigns ``self.<attr>``; its class has ``<member>``."""
    _, attr, member = use.target.split(".")
    init = release.find_method(llm_path, "LLM", "__init__")
    if init is None or f"self.{attr} =" not in init[0].source:
        return [f"LLM.{attr}: not an attribute LLM.__init__ sets in vllm=={release.files.version} (backend line "
                f"{use.line})"]
    if attr not in ATTRIBUTE_CLASSES:
        return [f"LLM.{attr}: add its class to ATTRIBUTE_CLASSES so .{member} can be checked"]
    path, cls = ATTRIBUTE_CLASSES[attr]
    if member in release.fields(path, cls) or release.find_method(path, cls, member) is not None:
        return []
    return [f"LLM.{attr}.{member}: {cls} has no field or method {member!r} in vllm=={release.files.version}"]


def check_option_values(llm_kwargs: dict, files: PinnedRelease) -> list[str]:
    """Option strings the backend passes to ``LLM`` (e.g. ``logprobs_mode="processed_logprobs"``,
    ``distributed_executor_backend="external_launcher"``) must be values the release's config modules spell out."""
    texts = [files.read(n) for n in sorted(files.names()) if n.startswith("vllm/config/") and n.endswith(".py")]
    blob = "\n".join(texts)
    errors = []
    for key, value in llm_kwargs.items():
        if isinstance(value, str) and key not in ("model", "tokenizer") and value:
            if f'"{value}"' not in blob and f"'{value}'" not in blob:
                errors.append(f"LLM(...): {key}={value!r} is not a value vllm=={files.version}'s config knows")
    return errors


def check_backend(source: str, api_table: dict[str, tuple[str, ...]], files: PinnedRelease,
                  llm_kwargs: Optional[dict] = None) -> list[str]:
    """All contract violations of the backend ``source`` (empty list = compatible with the pinned release);
    ``llm_kwargs``: a built ``LLM`` keyword set whose option strings are checked too."""
    release = Release(files)
    errors: list[str] = check_option_values(llm_kwargs, files) if llm_kwargs else []
    exported = release.exports()
    for name in vllm_imports(source):
        if name not in exported:
            errors.append(f"`from vllm import {name}`: vllm=={files.version} does not export {name}")
    llm_path = files.module_path(CONSTRUCTORS["LLM"])
    sp_path = files.module_path(CONSTRUCTORS["SamplingParams"])
    for use in backend_uses(source, api_table):
        if use.target == "LLM":
            errors += _check_call(release, llm_path, "LLM", "__init__", Use("LLM", 0, use.keywords))
        elif use.target == "SamplingParams":
            known = release.fields(sp_path, "SamplingParams")
            errors += [f"SamplingParams(...): keyword {kw!r} is not a field in vllm=={files.version}"
                       for kw in use.keywords if kw not in known]
        elif use.target.startswith("LLM."):
            method = use.target.split(".", 1)[1]
            errors += _check_call(release, llm_path, "LLM", method, use)
            if method == "apply_model":
                errors += _check_call(release, WORKER_CLASS[0], WORKER_CLASS[1], "apply_model", Use("", 1, line=use.line))
        elif use.target.startswith("worker."):
            errors += _check_call(release, *GPU_WORKER_CLASS, use.target.split(".", 1)[1], use)
        elif use.target.startswith("attr."):
            errors += _check_attribute(release, llm_path, use)
        elif use.target.startswith("model."):
            method = use.target.split(".", 1)[1]
            for path, cls in MODEL_CLASSES:
                errors += _check_call(release, path, cls, method, use)
    return errors
