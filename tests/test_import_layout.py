"""The repository root is on sys.path in every process started from it (`python -m pytest`,
`python -m benchmarks.decode_bench`, `python -m shardline.stage_worker`), so a top-level folder that
is a Python package there shadows any installed package of the same name. transformers 5.25 began
importing the PyPI package `kernels`, and our `kernels/` folder, then at the root, broke every
model class import (CI: 131 failed, 83 errors). These tests keep that from coming back."""
import importlib.metadata
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_top_level_folder_shadows_an_installed_package():
    owners = importlib.metadata.packages_distributions()  # top-level module -> its distributions
    ours = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    clashes = {name: owners[name] for name in ours if name in owners and set(owners[name]) != {"shardline"}}
    assert not clashes, (f"top-level folders {sorted(clashes)} shadow the installed packages {clashes} for any "
                         "process started from the repository root; move them under shardline/ or give them "
                         "a hyphenated name mapped in pyproject.toml, as services/ does")


def test_transformers_model_classes_import_from_the_repository_root():
    code = "import transformers; transformers.LlamaConfig; transformers.GPTJForCausalLM; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0 and "ok" in out.stdout, \
        "a process started from the repository root cannot load transformers' models:\n" + out.stderr[-2000:]
