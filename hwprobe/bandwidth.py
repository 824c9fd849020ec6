"""The speed model's constants, in their own module so that placement.py, experts.py and decode_speed.py read them
without importing each other.  A GPU's share of its bandwidth is measured, per engine and weight kind:
hwprobe.decode_speed."""

CPU_BANDWIDTH_EFFICIENCY = 0.6
UNKNOWN_GPU_BANDWIDTH_GBPS = 300.0  # a GPU missing from the known-GPU table
# Per layer and token a GPU also pays kernel launches and syncs (~10 kernels x ~2 us): small models are
# launch-bound, not bandwidth-bound, and without this a 135 M model would "run" at thousands of tokens/s.
GPU_SECONDS_PER_LAYER = 20e-6
