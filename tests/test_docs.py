"""The project stands alone: every file or module its docs and docstrings name exists in it, and the
deployment guide's certificate commands make what Flower needs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("server_app", "client_app", "strategies", "tasks", "benchmarks", "scripts", "docs", "tests")
PATH = re.compile(r"`((?:%s)/[\w./-]*\.(?:py|md|sh|toml))" % "|".join(TOP))
MODULE = re.compile(r"``((?:server_app|client_app|strategies|tasks)(?:\.\w+)+)")


def _texts():
    for path in [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("*/**/*.py")]:
        if ".git" not in path.parts:
            yield path, path.read_text(encoding="utf-8")


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT / Path(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_exists(dotted: str) -> bool:
    """``a.b.c`` names a module, or a name defined in one (``a.b`` defines ``c``; ``c.d`` a method)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        found = _module_file(parts[:end])
        if found is not None:
            if end == len(parts):
                return True
            name = parts[end]
            return re.search(rf"^\s*(def|class)\s+{name}\b|^{name}\s*[:=]|^\s+{name}\s*=|import .*\b{name}\b",
                             found.read_text(encoding="utf-8"), re.M) is not None
    return False


def test_every_file_named_in_docs_and_docstrings_exists():
    missing = sorted({f"{path.relative_to(ROOT)}: {name}" for path, text in _texts()
                      for name in PATH.findall(text) if not (ROOT / name.rstrip(".")).exists()})
    assert not missing, missing


def test_every_module_named_in_docstrings_exists():
    missing = sorted({f"{path.relative_to(ROOT)}: {name}" for path, text in _texts()
                      for name in MODULE.findall(text) if not _module_exists(name)})
    assert not missing, missing


SECTION_REF = re.compile(r'`(docs/[\w-]+\.md)`,?\s+(?:section\s+)?"([^"]+)"')


def _plain(text: str) -> str:
    """A heading or a quoted title as compared: quotes and backticks dropped, spaces collapsed, a
    trailing ellipsis (a shortened title) cut."""
    return " ".join(re.sub(r'[`"“”]', "", text).split()).rstrip("…. ")


def test_every_section_named_in_docs_exists():
    """A pointer like ``docs/lethe.md`, "Settings"`` names a heading of that page (a shortened
    title ending in an ellipsis names the heading it starts): moving a section must move its pointers."""
    headings = {path.relative_to(ROOT).as_posix(): [_plain(line.lstrip("#")) for line in
                                                    path.read_text(encoding="utf-8").splitlines()
                                                    if line.startswith("#")]
                for path in ROOT.glob("docs/*.md")}
    missing = sorted({f"{path.relative_to(ROOT)}: {doc} \"{title}\"" for path, text in _texts()
                      for doc, title in SECTION_REF.findall(text)
                      if not any(h.startswith(_plain(title)) for h in headings.get(doc, []))})
    assert not missing, missing


def test_nothing_points_outside_the_repository():
    outside = sorted({str(path.relative_to(ROOT)) for path, text in _texts()
                      if re.search(r"DESIGN\.md|\.\./shared|papers/\d{3}|paper `?\d{3}", text)})
    assert not outside, outside


@pytest.mark.skipif(shutil.which("openssl") is None or shutil.which("bash") is None, reason="needs openssl and bash")
def test_the_documented_certificate_recipe_names_the_server_and_loopback(tmp_path):
    """docs/deployment.md's openssl commands, run as written (``SERVER`` = a host name): the SuperLink
    certificate is signed by the CA, P-384, and valid for the name the nodes use *and* for 127.0.0.1
    and ::1, where Flower 1.42's SuperLink reaches its own Runtime API to start a run's ServerApp."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    text = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    block = re.search(r"\*\*Certificates\*\*.*?```bash\n(.*?)```", text, re.S).group(1)
    done = subprocess.run(["bash", "-c", block.replace("SERVER", "superlink.example.org")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    assert isinstance(server.public_key(), ec.EllipticCurvePublicKey) and server.public_key().curve.name == "secp384r1"
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "superlink.example.org" in names.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} >= {"127.0.0.1", "::1"}
