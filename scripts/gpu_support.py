"""Shared pieces of the GPU scripts (``gpu_smoke.py``, ``gpu_bench.py``): the one-line exit without CUDA, the
devices an FSDP run spreads over, the attention kernel, and MFU.

MFU here is the simple estimate ``6 x N x tokens / seconds / peak``: ``N`` every parameter of the model, the
tokens the real (non-padding) ones trained, ``peak`` the dense bf16 FLOP/s of the devices used. It leaves out
the attention term that ``hf_lightning.callbacks.Throughput``'s ``throughput/mfu`` adds (the PaLM estimate),
so the two differ by that term; the scripts print both.

The peak comes from ``hf_lightning.callbacks.throughput.DENSE_BF16_PEAK`` (H100 989, H100 PCIe 756, H200 989,
A100 312 TFLOP/s, ...), or ``--peak-tflops``, or, for a device in neither, the bf16 matmul rate measured on it
(:func:`measured_matmul_flops`): then MFU is against what the device reached, said in the output.
"""

from __future__ import annotations

import importlib.util
import sys
import time

NO_CUDA = "{name}: FAILED: no CUDA device (torch.cuda.is_available() is False); run it on a GPU machine"


def require_cuda(name: str) -> bool:
    """Whether a CUDA device is present; without one, print :data:`NO_CUDA` (one line, stderr) and return
    ``False`` (the script then exits 1: nothing was checked)."""
    import torch

    if torch.cuda.is_available():
        return True
    print(NO_CUDA.format(name=name), file=sys.stderr)
    return False


def attention_kernel() -> str:
    """``flash_attention_2`` when the ``flash_attn`` package is installed, else ``sdpa`` (PyTorch's fused
    attention); the scripts print which ran."""
    return "flash_attention_2" if importlib.util.find_spec("flash_attn") is not None else "sdpa"


def fsdp_layout(device_count: int, global_micro_batch: int = 4) -> tuple[int, int]:
    """``(devices, rows per device)`` of an FSDP run on ``device_count`` GPUs that keeps a global micro-batch
    of ``global_micro_batch`` rows: the most devices that divide it evenly (8 GPUs, 4 rows: 4 devices x 1).

    Raises:
        ValueError: ``device_count`` or ``global_micro_batch`` below 1.
    """
    if device_count < 1 or global_micro_batch < 1:
        raise ValueError(f"device_count={device_count}, global_micro_batch={global_micro_batch}: need >= 1")
    fits = range(1, min(device_count, global_micro_batch) + 1)
    devices = max(d for d in fits if global_micro_batch % d == 0)
    return devices, global_micro_batch // devices


def table_peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of one device named ``device_name`` from the project's table, ``None`` when it
    is not there."""
    from hf_lightning.callbacks.throughput import dense_peak_flops

    return dense_peak_flops(device_name)


def measured_matmul_flops(size: int = 8192, repeats: int = 10) -> float:
    """The bf16 matmul FLOP/s this CUDA device reaches on ``size x size`` operands (``2 size^3`` FLOPs per
    product), after one warm-up product: the fallback peak of a device missing from the table."""
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def peak_flops(device_name: str, given_tflops: float | None = None) -> tuple[float, str]:
    """``(peak FLOP/s of one device, where it came from)``: ``--peak-tflops`` when given, else the table,
    else the measured bf16 matmul rate (needs the CUDA device)."""
    if given_tflops is not None:
        return given_tflops * 1e12, "--peak-tflops"
    peak = table_peak_flops(device_name)
    if peak is not None:
        return peak, f"dense bf16 peak of {device_name}"
    return measured_matmul_flops(), f"measured bf16 matmul rate ({device_name} is not in the table)"


def mfu(params: int, tokens: float, seconds: float, peak: float, devices: int = 1) -> float:
    """Model FLOPs utilization ``6 x params x tokens / seconds / (peak x devices)``.

    Args:
        params: the model's parameters (all of them).
        tokens: real tokens trained in ``seconds`` (all devices together).
        seconds: wall time of those tokens.
        peak: one device's peak FLOP/s; ``devices``: how many trained.

    Raises:
        ValueError: ``seconds``, ``peak`` or ``devices`` not positive.
    """
    if seconds <= 0 or peak <= 0 or devices < 1:
        raise ValueError(f"seconds={seconds}, peak={peak}, devices={devices}: need positive values")
    return 6.0 * params * tokens / seconds / (peak * devices)
