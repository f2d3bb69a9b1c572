# The local stand-in for the trainer image's PyTorch base (pytorch/pytorch): the local Python
# base (Debian's Python in a virtualenv on PATH) plus torch at the version the harness is
# tested with (hack/constraints.txt). PyPI's Linux build of torch is the CUDA one: its nvidia-*
# libraries come along, which `import torch` needs even on a machine without a GPU, and which
# a GPU node uses. Built by `python -m trainguard_dev.images build`, once per machine cache.
ARG PYTHON_IMAGE
FROM ${PYTHON_IMAGE}
ARG TORCH_VERSION
RUN PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 pip install "torch==${TORCH_VERSION}" \
 && python -c "import torch; print('torch', torch.__version__)"
