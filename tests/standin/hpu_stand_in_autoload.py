"""torch's device-backend entry point for the stand-in (gaudi_launch_hpu_stand_in-0.dist-info).

A module of its own: when a script imports habana_frameworks before torch, the stand-in device
module is itself mid-import when torch calls this, and it registers the device on its own then.
"""

import sys


def autoload() -> None:
    device = sys.modules.get("hpu_stand_in_device")
    if device is not None and not hasattr(device, "autoload"):
        return  # partially imported: it is the one importing torch
    import hpu_stand_in_device

    hpu_stand_in_device.autoload()
