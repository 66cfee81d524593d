"""Which Vulkan driver the native adapter uses (Linux), decided before the first adapter request.

Whatever the user chose with ``VK_ICD_FILENAMES``, ``VK_DRIVER_FILES`` or
``VK_ADD_DRIVER_FILES`` is left alone. Otherwise the loader's default search is used when it
can find a driver manifest (lavapipe, NVIDIA, ...); when it cannot, a known manifest outside
the search path (NVIDIA's under /usr/local/nvidia, then SwiftShader's shipped with Debian's
chromium) is put in ``VK_ICD_FILENAMES``. Dawn rejects lavapipe, so for ``wgpudawn``
SwiftShader is added with ``VK_ADD_DRIVER_FILES`` (real GPUs stay visible).
:func:`use_vulkan_driver` picks a driver explicitly. All of this must happen before the first
adapter request of the process: the Vulkan loader reads the variables once.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import sys
from collections.abc import Sequence

__all__ = ["SWIFTSHADER_ICDS", "configure_vulkan_driver", "use_vulkan_driver",
           "vulkan_driver_manifests"]

_DRIVER_VARS = ("VK_ICD_FILENAMES", "VK_DRIVER_FILES", "VK_ADD_DRIVER_FILES")
SWIFTSHADER_ICDS = (
    "/usr/lib/chromium/vk_swiftshader_icd.json",
    "/usr/lib/chromium-browser/vk_swiftshader_icd.json",
    "/opt/google/chrome/vk_swiftshader_icd.json",
)
_EXTRA_GPU_ICDS = ("/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json",)
_LAVAPIPE_ICD_GLOB = "lvp_icd*.json"


def _icd_search_dirs() -> list[str]:
    """The folders the Vulkan loader searches for driver manifests (Linux)."""
    home = os.path.expanduser("~")
    config = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    data = os.environ.get("XDG_DATA_DIRS", "/usr/local/share:/usr/share").split(":")
    roots = [os.environ.get("XDG_CONFIG_HOME", f"{home}/.config"), *config, "/usr/local/etc",
             "/etc", os.environ.get("XDG_DATA_HOME", f"{home}/.local/share"), *data,
             "/usr/local/share", "/usr/share"]
    seen: list[str] = []
    for root in roots:
        path = os.path.join(root, "vulkan", "icd.d")
        if root and path not in seen:
            seen.append(path)
    return seen


def vulkan_driver_manifests() -> list[str]:
    """Vulkan driver manifests (ICD json files) the loader finds without any variable set."""
    found: list[str] = []
    for folder in _icd_search_dirs():
        found.extend(sorted(glob.glob(os.path.join(folder, "*.json"))))
    return found


def _first_existing(paths: Sequence[str]) -> str | None:
    return next((p for p in paths if os.path.isfile(p)), None)


def _user_driver_choice() -> dict[str, str]:
    return {v: os.environ[v] for v in _DRIVER_VARS if os.environ.get(v)}


def use_vulkan_driver(name: str) -> str | None:
    """Point the Vulkan loader at one driver: ``"swiftshader"``, ``"lavapipe"`` or a manifest
    path, unless the user already set a driver variable. Returns the manifest used, or None
    when nothing was changed. Call it before the process's first adapter request."""
    if _user_driver_choice() or sys.platform != "linux":
        return None
    if name == "swiftshader":
        path = _first_existing(SWIFTSHADER_ICDS)
    elif name == "lavapipe":
        path = next((m for m in vulkan_driver_manifests()
                     if fnmatch.fnmatch(os.path.basename(m), _LAVAPIPE_ICD_GLOB)), None)
    else:
        path = name if os.path.isfile(name) else None
    if path is None:
        return None
    os.environ["VK_ICD_FILENAMES"] = path
    return path


def configure_vulkan_driver(backend: str) -> str:
    """Make sure the Vulkan loader will find a driver that `backend` accepts (see the module
    docstring). Returns a short note of what was decided, for error messages."""
    if sys.platform != "linux":
        return "not Linux: platform default"
    user = _user_driver_choice()
    if user:
        return "user's choice: " + ", ".join(f"{k}={v}" for k, v in user.items())
    manifests = vulkan_driver_manifests()
    swiftshader = _first_existing(SWIFTSHADER_ICDS)
    if backend == "wgpudawn" and swiftshader:
        # Dawn refuses lavapipe; SwiftShader is its CPU fallback. Added, not replacing.
        os.environ["VK_ADD_DRIVER_FILES"] = swiftshader
        return f"VK_ADD_DRIVER_FILES={swiftshader} (Dawn rejects lavapipe); found {manifests}"
    if manifests:
        return f"loader default; found {manifests}"
    fallback = _first_existing(_EXTRA_GPU_ICDS) or swiftshader
    if fallback:
        os.environ["VK_ICD_FILENAMES"] = fallback
        return f"no manifest in the loader's search path; VK_ICD_FILENAMES={fallback}"
    return "no Vulkan driver manifest found (apt-get install libvulkan1 mesa-vulkan-drivers)"
