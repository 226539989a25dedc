"""dstoolkit: make DeepSpeed configs safe (validated), sized (estimated) and fast (benchmarked)."""
from setuptools import find_packages, setup

# Runtime pins are the versions the test suite runs against.
# torch: "==2.13.0" is also satisfied by local CUDA builds such as "2.13.0+cu128",
# so an existing CUDA torch 2.13.0 is kept. launch/_env.sh installs the CPU wheel
# only when the environment has no torch at all.
INSTALL_REQUIRES = [
    "deepspeed==0.19.8",
    "torch==2.13.0",
    "pydantic>=2.6,<3",
    "pyyaml>=6.0",
    "hjson>=3.1",
    "tqdm>=4.60",
    "psutil>=5.9",
    "optuna>=4.0",       # dstoolkit tune
    "matplotlib>=3.8",   # dstoolkit report / tune plots
]

EXTRAS = {
    "te": ["transformer-engine[pytorch]"],
    "dev": [
        "pytest>=8",
        "pytest-timeout>=2.3",
        "hypothesis>=6.100",
    ],
}

setup(
    name="dstoolkit",
    version="0.1.0",
    description="Validate, generate, estimate and benchmark DeepSpeed configs before you launch.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["dstoolkit", "dstoolkit.*"]),
    include_package_data=True,
    package_data={"dstoolkit": ["data/*", "data/**/*"], "dstoolkit.dsconfig": ["*.json"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["dstoolkit=dstoolkit.cli:main"]},
)
