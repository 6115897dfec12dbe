"""lite: a small, fast GGUF inference runtime (CuPy + Numba CUDA, NumPy on the CPU)."""
from setuptools import setup

NUMBA = ["numba>=0.59", "numba-cuda>=0.20"]
CUDA12 = ["cupy-cuda12x>=13", *NUMBA]

setup(
    name="lite",
    version="0.1.0",
    description="Small, fast GGUF LLM inference on NVIDIA GPUs with CuPy and Numba; NumPy on the CPU",
    python_requires=">=3.10",
    # kernels/, models/ and cli/ sit at the top of the repository but install under lite.*,
    # so nothing named `kernels` or `models` lands at the top of site-packages.
    packages=["lite", "lite.backends", "lite.chain", "lite.engine", "lite.files", "lite.server",
              "lite.kernels", "lite.models", "lite.cli"],
    package_dir={
        "lite": "lite",
        "lite.kernels": "kernels",
        "lite.models": "models",
        "lite.cli": "cli",
    },
    # A CPU install pulls no CUDA or LLVM wheels: numba (and its llvmlite) and CuPy come with a
    # GPU extra; the test extra has numba too, since CI runs the kernels under its CUDA simulator.
    install_requires=[
        "numpy>=1.24",
        "gguf>=0.10",
        "click>=8.0",
        "jinja2>=3.0",
        "regex>=2023.0",
        "threadpoolctl>=3.0",
    ],
    extras_require={
        "cuda": CUDA12,
        "cuda12": CUDA12,
        "cuda13": ["cupy-cuda13x>=13", *NUMBA],
        "test": ["pytest>=7", "openai>=1.0", "anthropic>=0.40", "selenium>=4.10", "jsonschema>=4",
                 "starlette>=0.40", "uvicorn>=0.30", "llguidance>=1.0", *NUMBA],
        "server": ["starlette>=0.40", "uvicorn>=0.30", "llguidance>=1.0"],
    },
    # the kernels' CUDA C (kernels/cuda_source.py reads them at run time); the server's chat page
    package_data={"lite.kernels": ["cuda/*.cu", "cuda/*.cuh"], "lite.server": ["webui/*.html"]},
    entry_points={"console_scripts": ["lite=lite.cli.main:main"]},
)
