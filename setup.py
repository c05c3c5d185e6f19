"""torch_overlay: fixes for PyTorch internals, applied at import time, in source builds and upstream."""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent

setup(
    name="torch_overlay",
    version="0.1.0",
    description="Fixes for PyTorch internals (DTensor, AOTAutograd, inductor) on released torch",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=["torch_overlay", "torch_overlay.recipes", "torch_overlay.tools", "torch_overlay.patches"],
    # The patch series ships inside the package; a source checkout reads ./patches directly.
    package_dir={"torch_overlay.patches": "patches"},
    package_data={"torch_overlay.patches": ["series", "*.patch"]},
    install_requires=["torch>=2.11"],
    extras_require={"test": ["expecttest", "hypothesis", "pytest", "numpy"]},
)
