"""The project's images, built here as users build them, run their programs as their own users.

Each image is built (or found in the cache) by trainguard_dev.images, unpacked by umoci and run
once with runc, as the user the image declares: no engine, no containerd. A cold cache builds
the torch base first (PyPI's torch and its CUDA libraries: gigabytes, several minutes).
"""

from __future__ import annotations

import pytest

from trainguard_dev import images

pytestmark = [pytest.mark.realnodes]


@pytest.mark.timeout(900)
def test_operator_image_runs_the_operator_as_its_user() -> None:
    image = images.build_images([images.OPERATOR.name])[images.OPERATOR.name]
    assert image.ref.startswith(f"{images.REGISTRY}/trainguard:")
    assert image.user == "65532:65532"
    assert image.tar.is_file() and image.digest.startswith("sha256:")

    out = images.run_in_image(image, ["trainguard", "operator", "--help"])
    assert "usage:" in out.lower() and "operator" in out
    # The user has a name: an ssh:// layer's OpenSSH config lookup (paramiko) asks for it.
    script = (
        "import getpass, os, paramiko; "
        "print(os.getuid(), getpass.getuser(), "
        "paramiko.SSHConfig.from_text('Host b\\n  Port 2222').lookup('b')['port'])"
    )
    assert images.run_in_image(image, ["python", "-c", script]).split() == [
        "65532",
        "trainguard",
        "2222",
    ]


@pytest.mark.timeout(2400)
def test_trainer_image_imports_torch_and_the_harness_as_its_user() -> None:
    image = images.build_images([images.TRAINER.name])[images.TRAINER.name]
    assert image.ref.startswith(f"{images.REGISTRY}/trainguard-trainer:")
    assert image.user == "10001"

    script = (
        "import os, torch, trainguard_harness.train; "
        "print(os.getuid(), torch.__version__.split('+')[0], torch.tensor([2.0]).sum().item())"
    )
    out = images.run_in_image(image, ["python", "-c", script])
    uid, version, value = out.split()
    assert (uid, value) == ("10001", "2.0")
    assert version == images.torch_version()
