#!/usr/bin/env python3
"""flashcheck's reference external worker: PyTorch's scaled-dot-product
attention backends, and FlexAttention, as subjects (docs/external-subjects.md):

  torch-flash      FlashAttention-2 inside PyTorch (aten::_flash_attention_forward)
  torch-efficient  the memory-efficient (xFormers/CUTLASS) kernel
                   (aten::_efficient_attention_forward)
  torch-cudnn      cuDNN's SDPA through PyTorch (aten::_scaled_dot_product_cudnn_attention)
  torch-math       the reference composite (torch.nn.functional.scaled_dot_product_attention
                   under sdpa_kernel(MATH)); returns no LSE

  torch-flash-det, torch-efficient-det
                   the same kernels under torch.use_deterministic_algorithms(True),
                   which PyTorch documents as making their backward deterministic

  torch-flex       FlexAttention (torch.nn.attention.flex_attention), compiled:
                   the serving vocabulary's score modifications as a score_mod
                   (softcap=C: C tanh(s / C) of the scaled logit; alibi=yes:
                   - slope_h |i + (Lk - Lq) - j|), the masks and lengths as -inf
                   in the same score_mod. The forward only. torch has no paged
                   K/V in flex_attention's public call (its paged helper is
                   experimental): page= stays outside this worker's domain.

Usage, one subject per process: flashcheck external --cmd 'python3 external/torch_sdpa.py'
--name torch-flash run ... (or --config external/torch_sdpa.json for all six).

The fused backends are called through their aten operators, not through the
public function, so that the subject is one kernel (the public function picks
whichever backend it prefers) and its LSE comes from the same launch as O.
torch's own eligibility checks (torch.backends.cuda.can_use_*_attention)
run first, and their reasons become `unsupported` answers.

Masks, per backend (flashcheck's definitions: core/problem.hpp):
  flash      none; causal_br and window as FlashAttention's window_size
             (bottom-right aligned, as flashcheck's); causal_tl only when
             seqlen_q == seqlen_kv (FlashAttention has no top-left causal).
  efficient  none; causal_tl and causal_br as its custom_mask_type 1 and 2;
             window and per-sequence lengths as an additive -inf bias.
  cudnn      none; causal_tl as is_causal (top-left in cuDNN); causal_br,
             window and per-sequence lengths as an additive -inf bias.
  math       causal_tl as is_causal; every other mask as a boolean mask.
Outputs are returned as the backend computes them, with two representation
mappings only: LSE padding and trailing unit dimensions are cut off, and
FlashAttention-2's +inf LSE sentinel for a row that sees no key (its
documented convention) becomes flashcheck's -inf. Nothing else is mapped: a
NaN, a nonzero row where every key is masked, or an LSE of 0 for such a row
is returned as it came, for flashcheck to judge.

The backward (protocol 2, pass=bwd) goes through autograd: Q, K and V
require grad, the same call as the forward runs (the same operator, masks and
bias), and O.backward(dO) gives dQ, dK and dV; dK and dV come per K/V head
(flash and cudnn take GQA natively and sum over the group in their backward;
math repeats K/V under enable_gqa, and autograd sums the repeats). torch
recomputes its own forward and saves its own O and LSE for the backward: it
does not take the O and LSE that flashcheck hands over, so a framework
backend is judged on its forward-and-backward composite. The oracle's
gradient is the exact function's, so this judges the right thing; a wrong
forward LSE would show in the gradients too. dO is zeroed in padding rows
(rows past a sequence's length are not the problem's; a varlen kernel never
sees them), which makes their contributions to dK and dV exactly zero.

Determinism, per backend, from PyTorch's Reproducibility notes ("CUDA Scaled
Dot Product Attention", docs/source/notes/randomness.rst, pytorch/pytorch PR
#182551): math is deterministic; flash's backward uses atomics by default
and efficient's may split the keys (num_splits_key > 1), both made
deterministic by torch.use_deterministic_algorithms(True, warn_only=False)
(the -det subjects); cuDNN's backward is not, and that mode disables it.
"""
import os
import sys
import warnings

# The worker protocol comes from the flashcheck_worker package (python/):
# the repository's own copy, whether or not one is installed.
sys.dont_write_bytecode = True  # no __pycache__ in the repository's python/src
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "src"))
from flashcheck_worker import Failed, Hello, Result, Unsupported, serve  # noqa: E402

SUBJECTS = ("torch-flash", "torch-efficient", "torch-cudnn", "torch-math", "torch-flash-det", "torch-efficient-det",
            "torch-flex")

#: Whether each backend's backward is bitwise repeatable, as PyTorch documents
#: it (the module's docstring says where): the -det subjects run under
#: torch.use_deterministic_algorithms(True). flashcheck's determinism property
#: holds a subject declared deterministic to every bit.
BACKWARD_DETERMINISTIC = {"torch-flash": False, "torch-efficient": False, "torch-cudnn": False, "torch-math": True,
                          "torch-flash-det": True, "torch-efficient-det": True, "torch-flex": False}


def backend_of(subject):
    """torch-flash-det -> torch-flash: the kernel a subject runs."""
    return subject[:-len("-det")] if subject.endswith("-det") else subject


def capabilities(subject, torch):
    """Each backend's domain (its sdp_utils checks in torch 2.11; observed on the H200), the
    backward included: the same domain, torch's own checks with requires_grad refusing the rest."""
    caps = forward_capabilities(backend_of(subject), torch)
    if subject == "torch-flex":  # the forward only: its score_mod's backward is not checked here yet
        return caps
    # Every backend feeds P and dS to its products in the working dtype: the
    # fused kernels as tensor-core operands, math as autograd in that dtype.
    caps.update(backward=True, backward_deterministic=BACKWARD_DETERMINISTIC[subject],
                backward_operands_in_dtype=True)
    if subject.endswith("-det"):
        caps["known_deviations"] += "; under torch.use_deterministic_algorithms(True)"
    return caps


def forward_capabilities(subject, torch):
    common = {"layouts": ["bhsd", "bshd"], "needs_gpu": True, "empty_sequences": False, "tile_q": 128,
              "tile_kv": 128}
    if subject == "torch-flash":
        return dict(common, dtypes=["f16", "bf16"], head_dims=[8, 32, 64, 72, 96, 128, 192, 256],
                    head_dim_v_equal=True, masks=["none", "causal_tl", "causal_br", "window"], gqa=True,
                    varlen=False, lse=True, min_compute_capability=80,
                    known_deviations="causal_tl only where seqlen_q == seqlen_kv; +inf LSE of key-less rows "
                                     "mapped to -inf")
    if subject == "torch-efficient":
        return dict(common, dtypes=["f32", "f16", "bf16"], head_dims=[8, 16, 32, 64, 96, 128, 256, 512],
                    max_head_dim_v=512, masks=["none", "causal_tl", "causal_br", "window"], gqa=False, varlen=True,
                    lse=True, min_compute_capability=50,
                    known_deviations="head dims (and dv) multiples of 8; window and per-sequence lengths as an "
                                     "additive -inf bias")
    if subject == "torch-cudnn":
        return dict(common, dtypes=["f16", "bf16"], head_dims=[8, 32, 64, 72, 96, 128, 192, 256],
                    max_head_dim_v=256, masks=["none", "causal_tl", "causal_br", "window"], gqa=True, varlen=True,
                    lse=True, min_compute_capability=80,
                    known_deviations="dv a multiple of 8; seqlen_kv 1 refused by torch; causal_br, window and "
                                     "per-sequence lengths as an additive -inf bias")
    if subject == "torch-flex":
        return dict(common, dtypes=["f32", "f16", "bf16"], head_dims=[16, 32, 64, 128, 256], head_dim_v_equal=True,
                    masks=["none", "causal_tl", "causal_br", "window"], gqa=True, varlen=True, lse=True,
                    softcap=True, alibi=True, min_compute_capability=80,
                    known_deviations="compiled by torch.compile per score_mod topology (the first case of each "
                                     "compiles for seconds); masks as -inf in the score_mod, not a block mask")
    return dict(common, dtypes=["f32", "f16", "bf16"], min_head_dim=1, max_head_dim=512, max_head_dim_v=512,
                masks=["none", "causal_tl", "causal_br", "window"], gqa=True, varlen=True, lse=False,
                min_compute_capability=0,
                known_deviations="no LSE; f16/bf16 computed in f32 (torch's math backend upcasts)")


class Backend:
    def __init__(self, subject):
        if subject in ("torch-math",) or subject.endswith("-det"):
            # Deterministic cuBLAS needs its workspace fixed before CUDA starts
            # (torch.use_deterministic_algorithms' documentation).
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        import numpy
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.np, self.torch, self.F = numpy, torch, F
        self.SDPBackend, self.sdpa_kernel = SDPBackend, sdpa_kernel
        self.subject = backend_of(subject)
        if self.subject != subject or subject == "torch-math":
            torch.use_deterministic_algorithms(True, warn_only=False)
        torch.set_warn_always(True)  # the eligibility checks' reasons are warnings: every time, not once
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device visible to torch")
        self.device = torch.device("cuda")
        self.dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

    def version(self):
        torch = self.torch
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {cudnn}), "
                f"{torch.cuda.get_device_name()}")

    # ---- inputs and outputs ------------------------------------------------
    def load(self, request, name, requires_grad=False):
        """Input `name` as a [B, H, S, D] view of a tensor in storage order; with
        requires_grad, (the view, its leaf), whose .grad is in storage order."""
        np, torch = self.np, self.torch
        shape = request.message["shape"]
        array = request.load(name)  # bf16 as its bit pattern
        if shape["dtype"] == "bf16":
            tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
        tensor = tensor.to(self.device)
        if requires_grad:
            tensor.requires_grad_(True)
        # Storage order -> [B, H, S, D] view.
        view = tensor.transpose(1, 2) if shape["layout"] == "bshd" else tensor
        return (view, tensor) if requires_grad else view

    def o_array(self, o_bhsd, shape):
        """O in storage order as NumPy (bf16 as its bit pattern), for the package to write."""
        return self.storage_array(o_bhsd.transpose(1, 2) if shape["layout"] == "bshd" else o_bhsd, shape)

    def storage_array(self, tensor, shape):
        """A tensor already in storage order as NumPy in the problem's dtype (bf16 as its bit pattern)."""
        tensor = tensor.to(self.dtypes[shape["dtype"]]).contiguous().cpu()
        return tensor.view(self.torch.int16).numpy() if shape["dtype"] == "bf16" else tensor.numpy()

    # ---- masks ---------------------------------------------------------------
    def visible(self, shape):
        """[B, 1, Sq, Skv] booleans: which keys each query may see (flashcheck's rule)."""
        torch = self.torch
        b, sq, skv = shape["batch"], shape["seqlen_q"], shape["seqlen_kv"]
        lens_q = shape["lens_q"] or [sq] * b
        lens_kv = shape["lens_kv"] or [skv] * b
        i = torch.arange(sq, device=self.device).view(1, sq, 1)
        j = torch.arange(skv, device=self.device).view(1, 1, skv)
        lq = torch.tensor(lens_q, device=self.device).view(b, 1, 1)
        lk = torch.tensor(lens_kv, device=self.device).view(b, 1, 1)
        offset = lk - lq
        ok = (j < lk) & (i >= 0)  # [B, Sq, Skv]
        mask = shape["mask"]
        if mask == "causal_tl":
            ok = ok & (j <= i)
        elif mask == "causal_br":
            ok = ok & (j <= i + offset)
        elif mask == "window":
            left, right = shape["window_left"], shape["window_right"]
            if left >= 0:
                ok = ok & (j >= i + offset - left)
            if right >= 0:
                ok = ok & (j <= i + offset + right)
        return ok.view(b, 1, sq, skv)

    def bias(self, shape, dtype, heads, align=1):
        """The additive form of visible(): 0 or -inf, [B, H, Sq, Skv], its rows padded to `align`."""
        torch = self.torch
        ok = self.visible(shape)
        b, sq, skv = shape["batch"], shape["seqlen_q"], shape["seqlen_kv"]
        padded = -(-skv // align) * align
        bias = torch.zeros(b, 1, sq, padded, dtype=dtype, device=self.device)
        bias[..., :skv].masked_fill_(~ok, float("-inf"))
        return bias[..., :skv].expand(b, heads, sq, skv)

    def no_key_rows(self, shape):
        return ~self.visible(shape).any(dim=-1)  # [B, 1, Sq]

    def eligible(self, check, q, k, v, mask, causal, gqa):
        torch = self.torch
        params = torch.backends.cuda.SDPAParams(q, k, v, mask, 0.0, causal, gqa)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok = check(params, True)
        if not ok:
            reasons = "; ".join(str(w.message).strip() for w in caught)
            # With no warning caught, torch's reasons went to the worker's stderr (worker.log).
            raise Unsupported(reasons or f"torch declined ({check.__name__} returned False; its reasons, if any, "
                                         f"are in the worker's stderr)")

    # ---- the call ------------------------------------------------------------
    def prepare(self, shape, q, k, v):
        """A closure that makes one call and returns (O [B,H,Sq,Dv], LSE [B,H,Sq] or None)."""
        torch = self.torch
        scale = shape["softmax_scale"]
        gqa = shape["heads_q"] != shape["heads_kv"]
        mask = shape["mask"]
        sq, skv = shape["seqlen_q"], shape["seqlen_kv"]
        if self.subject == "torch-flash":
            if mask == "causal_tl" and sq != skv:
                raise Unsupported("FlashAttention's causal mask is bottom-right aligned; top-left only where "
                                  "seqlen_q == seqlen_kv")
            self.eligible(torch.backends.cuda.can_use_flash_attention, q, k, v, None, False, gqa)
            left, right = -1, -1
            if mask in ("causal_tl", "causal_br"):
                right = 0
            elif mask == "window":
                left, right = shape["window_left"], shape["window_right"]
            qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))  # [B, S, H, D]

            def call():
                out = torch.ops.aten._flash_attention_forward(
                    qs, ks, vs, None, None, sq, skv, 0.0, False, False, scale=scale,
                    window_size_left=left, window_size_right=right)
                return out[0].transpose(1, 2), out[1]
            if mask == "none":
                return call, None
            rows = self.no_key_rows(shape)

            def finish(o, lse):  # FlashAttention-2's +inf sentinel of a key-less row -> -inf
                return o, torch.where(rows & torch.isposinf(lse), float("-inf"), lse)
            return call, finish
        if self.subject == "torch-efficient":
            self.eligible(torch.backends.cuda.can_use_efficient_attention, q, k, v, None, False, gqa)
            custom = {"none": 0, "causal_tl": 1, "causal_br": 2}.get(mask)
            bias = None
            if custom is None or shape["lens_q"] or shape["lens_kv"]:
                custom = 0
                bias = self.bias(shape, q.dtype, shape["heads_q"], align=16)
            qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))

            def call():
                out = torch.ops.aten._efficient_attention_forward(
                    qs, ks, vs, bias, None, None, None, None, 0.0, custom, True, scale=scale)
                return out[0].transpose(1, 2), out[1][..., :sq]
            return call, None
        if self.subject == "torch-cudnn":
            causal = mask == "causal_tl" and not (shape["lens_q"] or shape["lens_kv"])
            bias = None
            if mask != "none" and not causal or shape["lens_q"] or shape["lens_kv"]:
                bias = self.bias(shape, q.dtype, shape["heads_q"])
            self.eligible(torch.backends.cuda.can_use_cudnn_attention, q, k, v, bias, causal, gqa)

            def call():
                out = torch.ops.aten._scaled_dot_product_cudnn_attention(
                    q, k, v, bias, True, 0.0, causal, False, scale=scale)
                return out[0], out[1].reshape(q.shape[0], q.shape[1], sq)
            return call, None
        if self.subject == "torch-flex":
            return self.prepare_flex(shape, q, k, v, scale, gqa)
        # torch-math: the public function, pinned to the math backend.
        causal = mask == "causal_tl" and not (shape["lens_q"] or shape["lens_kv"])
        attn_mask = None if mask == "none" and not (shape["lens_q"] or shape["lens_kv"]) or causal \
            else self.visible(shape)

        def call():
            with self.sdpa_kernel(self.SDPBackend.MATH):
                return self.F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal,
                                                           scale=scale, enable_gqa=gqa), None
        return call, None

    def prepare_flex(self, shape, q, k, v, scale, gqa):
        """FlexAttention, compiled once per process (dynamic shapes): the score_mod
        applies the softcap, then ALiBi, then the mask (flashcheck's order:
        core/problem.hpp), reading tensors captured per call."""
        torch = self.torch
        if getattr(self, "flex", None) is None:
            from torch.nn.attention.flex_attention import flex_attention
            self.flex = torch.compile(flex_attention, dynamic=True)
        b, sq, skv = shape["batch"], shape["seqlen_q"], shape["seqlen_kv"]
        visible = self.visible(shape).view(b, sq, skv)
        softcap = float(shape.get("softcap", 0.0) or 0.0)
        alibi = bool(shape.get("alibi", False))
        lens_q = torch.tensor(shape["lens_q"] or [sq] * b, device=self.device)
        lens_kv = torch.tensor(shape["lens_kv"] or [skv] * b, device=self.device)
        offset = lens_kv - lens_q
        heads = shape["heads_q"]
        m = 1
        while m * 2 <= heads:
            m *= 2
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / m) if h < m else 2.0 ** (-4.0 * (2 * (h - m) + 1) / m)
                               for h in range(heads)], device=self.device, dtype=torch.float32)
        cap = torch.tensor(softcap if softcap > 0 else 1.0, device=self.device, dtype=torch.float32)

        def score_mod(score, bi, hi, qi, ki):
            if softcap > 0:
                score = cap * torch.tanh(score / cap)
            if alibi:
                score = score - slopes[hi] * (qi + offset[bi] - ki).abs()
            return torch.where(visible[bi, qi, ki], score, -float("inf"))

        def call():  # returned as flex computes them (a row that sees no key: flex's own O and LSE)
            return self.flex(q, k, v, score_mod=score_mod, scale=scale, enable_gqa=gqa, return_lse=True)
        return call, None

    def run(self, request):
        if request.backward:
            return self.run_backward(request)
        torch = self.torch
        shape = request.message["shape"]
        q, k, v = (self.load(request, key) for key in ("q", "k", "v"))
        call, finish = self.prepare(shape, q, k, v)
        if request.timing:
            return Result(times_ms=self.time(shape, call, q, k, v, request.timing))
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            o, lse = call()
        except RuntimeError as error:
            # The operator's own input checks (TORCH_CHECK: alignment, shapes)
            # are torch's domain, beyond what can_use_* checks: unsupported.
            # A CUDA error is a failure of the call.
            text = (str(error).strip().splitlines() or [type(error).__name__])[0]
            if "CUDA error" in text or "illegal memory" in text.lower():
                raise
            raise Unsupported(f"torch refused: {text}")
        stop.record()
        torch.cuda.synchronize()
        if finish:
            o, lse = finish(o, lse)
        return Result(o=self.o_array(o, shape), lse=None if lse is None else lse.float().contiguous().cpu().numpy(),
                      time_ms=start.elapsed_time(stop))

    def run_backward(self, request):
        """dQ, dK, dV through autograd: the forward's call with Q, K, V requiring
        grad, then O.backward(dO). torch saves its own forward's O and LSE; the
        O and LSE flashcheck hands over are not used (the module's docstring)."""
        torch = self.torch
        shape = request.message["shape"]
        if request.timing:
            raise Unsupported("timing the backward is not in the protocol")
        (q, q_leaf), (k, k_leaf), (v, v_leaf) = (self.load(request, key, requires_grad=True) for key in "qkv")
        dout = self.load(request, "do").clone()
        lens_q = shape["lens_q"] or []
        for b, length in enumerate(lens_q):  # padding rows are not the problem's: no gradient flows from them
            dout[b, :, length:, :] = 0
        call, _ = self.prepare(shape, q, k, v)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        try:
            o, _ = call()
            if not o.requires_grad:  # the harness's problem, not torch's domain: an error, not unsupported
                raise Failed(f"{self.subject}'s operator gave an output without autograd history")
            start.record()
            o.backward(dout)
            stop.record()
        except RuntimeError as error:
            text = (str(error).strip().splitlines() or [type(error).__name__])[0]
            if "CUDA error" in text or "illegal memory" in text.lower():
                raise
            if "derivative for" in text and "not implemented" in text:  # no autograd formula: not a domain limit
                raise Failed(f"torch has no backward for {self.subject}'s operator: {text}")
            raise Unsupported(f"torch refused the backward: {text}")
        torch.cuda.synchronize()
        return Result(dq=self.storage_array(q_leaf.grad, shape), dk=self.storage_array(k_leaf.grad, shape),
                      dv=self.storage_array(v_leaf.grad, shape), time_ms=start.elapsed_time(stop))

    def time(self, shape, call, q, k, v, timing):
        """CUDA-event times of the call alone; the inputs' copies rotate only
        through the closure's own tensors, so input_sets > 1 re-prepares."""
        torch = self.torch
        sets = [call]
        for _ in range(1, max(1, timing.input_sets)):
            copy = [t.clone() for t in (q, k, v)]
            sets.append(self.prepare(shape, *copy)[0])
        for n in range(timing.warmup):
            sets[n % len(sets)]()
        torch.cuda.synchronize()
        times = []
        for n in range(timing.repeats):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            sets[n % len(sets)]()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        return times


def is_fatal(error):
    """A CUDA error is sticky: this process's context cannot run another
    case. The package says so (flashcheck starts a new worker) and exits."""
    return "CUDA error" in str(error) or type(error).__name__ == "AcceleratorError"


def main():
    backend = None

    def hello(subject):  # no torch, no GPU: what this raises is the handshake's error
        nonlocal backend
        backend = Backend(subject)
        return Hello(capabilities(subject, backend.torch),
                     description=f"PyTorch SDPA backend {subject.split('-', 1)[1]} (external worker)",
                     version=backend.version())

    sys.exit(serve(hello, lambda request: backend.run(request), subjects=SUBJECTS, is_fatal=is_fatal))


if __name__ == "__main__":
    main()
