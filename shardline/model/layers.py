"""The parallel building blocks: linears (dense or int8 weight-only) and the vocab-parallel embedding.

Megatron's split: column-parallel linears (qkv, gate/up) need no communication; row-parallel ones
(o, down) produce partial sums that the caller all-reduces, then adds the bias once.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from shardline.kernels import activation, gemv, quant
from shardline.kernels._dispatch import use_triton
from shardline.kernels.norm import RowNorm
from shardline.parallel import TPGroup

log = logging.getLogger(__name__)


class Linear:
    """y = x @ W.T (+ bias). `weight` is [out, in]; int8 weights carry a per-row `scale`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 scale: torch.Tensor | None = None) -> None:
        self.weight, self.bias, self.scale = weight, bias, scale
        self.gemms = None  # a GemmTable from `shardline tune-gemm`, when loaded
        self.centre = None  # fp32 [out], each weight row's sum, where a LayerNorm folds in (fold_layer_norm)
        self.exp12 = None  # the weight in the 12-bit form, where the table chose it (prepare_exp12)

    def _choice(self, x: torch.Tensor) -> dict | None:
        if self.gemms is None:
            return None
        n, k = self.weight.shape
        choice = self.gemms.choice(n, k, self.weight.dtype, x.dtype, x.shape[0])
        if choice is not None and choice["impl"] == "exp12" and (self.exp12 is None
                                                                 or self.exp12.unfit(choice.get("config"))):
            return None  # the form did not take this weight or config (prepare_exp12 said why): the default path
        return choice

    def prepare_exp12(self, glu: bool, allowed: bool = True) -> None:
        """Pack this bf16 weight in the 12-bit form (kernels/exp12.py; `glu`: the fused [gate; up]
        projection) where the table chose that form at some batch size: at load, never inside a
        captured step. The bf16 weight stays for the other batch sizes. Where the form cannot take
        the weight, or the product is not one it runs (`allowed`), a warning, and those batch sizes
        take the default path."""
        from shardline.gemm_tuning import key
        from shardline.kernels import exp12
        n, k = self.weight.shape
        by_m = self.gemms.entries.get(key(n, k, self.weight.dtype, self.weight.dtype), {}) if self.gemms else {}
        if not any(isinstance(e, dict) and e.get("impl") == "exp12" for e in by_m.values()):
            self.exp12 = None
            return
        if not allowed or self.scale is not None or self.weight.dtype != torch.bfloat16:
            self.exp12 = None
            log.warning("GEMM table: exp12 entry for the %dx%d product, which the 12-bit kernel does not run "
                        "(the engine runs it for a layer's bf16 products, not the head's); its default path runs",
                        n, k)
            return
        if self.exp12 is None or self.exp12.glu != glu:  # else packed for a table before (the weights do not change)
            try:
                self.exp12 = exp12.pack(self.weight, glu=glu)
            except ValueError as e:
                self.exp12 = None
                log.warning("GEMM table: exp12 entry for the %dx%d product: %s; its default path runs", n, k, e)
                return
        for m, e in by_m.items():
            if isinstance(e, dict) and e.get("impl") == "exp12" and (why := self.exp12.unfit(e.get("config"))):
                log.warning("GEMM table: exp12 entry for the %dx%d product at %s rows: %s; its default path runs",
                            n, k, m, why)

    def _runs_gemv(self, x: torch.Tensor, choice: dict | None) -> bool:
        if choice is not None:
            return choice["impl"] == "gemv" and gemv.fits(x, self.weight)
        return gemv.preferred(x, self.weight, self.scale, self.bias)

    def uses_gemv(self, x: torch.Tensor) -> bool:
        """One row (batch-1 decode) runs the GEMV kernel: as `tune-gemm` chose for this GPU when a
        table is loaded, else wherever the CUDA C GEMV takes the operands (shardline/kernels/gemv.py)."""
        return self._runs_gemv(x, self._choice(x))

    def __call__(self, x: torch.Tensor, add_bias: bool = True, out_dtype: torch.dtype | None = None,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        """`out_dtype`: the result's dtype, if not x's (the split-K kernel and cuBLAS write it
        directly). `bias`: another linear's bias to add in this product's epilogue in place of its
        own (GPT-J's o product carries down's: `accumulate`)."""
        if bias is None and add_bias:
            bias = self.bias
        return self._product(x, bias, out_dtype=out_dtype)

    def accumulate(self, x: torch.Tensor, onto: torch.Tensor) -> torch.Tensor:
        """onto += x @ W.T (no bias), returned: cuBLAS's own accumulate (addmm's beta = 1) where
        this product runs cuBLAS for x's rows, so the sum takes no add kernel; else the product,
        then the add. GPT-J's parallel residual sums attention's and the MLP's outputs so."""
        choice = self._choice(x)
        if (self.scale is None and x.dim() == 2 and onto.is_contiguous() and not self._runs_gemv(x, choice)
                and (choice is None or choice["impl"] == "cublas")):
            return onto.addmm_(x, self.weight.t())
        return onto.add_(self._product(x, None))

    def glu(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this fused [gate; up] projection: in the product's epilogue where the
        table chose a Triton kernel for x's rows, else the product, then the activation kernel."""
        return self._product(x, self.bias, glu=True)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        """gelu_tanh(this product + bias): in the split-K kernel's epilogue where the table chose it
        for x's rows, else the product, then the activation kernel."""
        return self._product(x, self.bias, gelu=True)

    def _product(self, x: torch.Tensor, bias: torch.Tensor | None, glu: bool = False,
                 out_dtype: torch.dtype | None = None, gelu: bool = False) -> torch.Tensor:
        choice = self._choice(x)
        impl = choice["impl"] if choice is not None else None
        if impl == "triton":  # SwiGLU or GELU in its epilogue
            return quant.small_m_linear(x, self.weight, self.scale, bias, choice["config"], glu=glu,
                                        out_dtype=out_dtype, gelu=gelu)
        if impl == "ring":  # SwiGLU in its epilogue too, and the logits' fp32 from its sums
            y = quant.ring_linear(x, self.weight, bias, choice["config"], glu=glu, out_dtype=out_dtype)
        elif impl == "exp12" and glu == self.exp12.glu:  # SwiGLU in its epilogue too
            y = quant.exp12_linear(x, self.exp12, bias, choice["config"])
        elif impl == "streamk":  # SwiGLU in its epilogue too
            y = quant.streamk_linear(x, self.weight, self.scale, bias, glu=glu, config=choice["config"])
        else:
            if self._runs_gemv(x, choice):
                y = gemv.fused_linear(x, self.weight, self.scale, bias, config=choice and choice["config"])[0]
            elif self.scale is not None:
                y = quant.quantized_linear(x, self.weight, self.scale, bias)
            else:
                y, fused_gelu = cublas_linear(x, self.weight, bias, out_dtype, gelu and not glu)
                gelu = gelu and not fused_gelu
            if glu:
                y = activation.silu_and_mul(y)
        if gelu:
            y = activation.gelu_tanh(y)
        return y if out_dtype is None else y.to(out_dtype)

    def folds(self, x: torch.Tensor) -> bool:
        """The product takes the fold (`fold`) in its epilogue at x's rows: where the table chose
        the split-K or the ring kernel, and off the GPU, where the reference computes the same."""
        choice = self._choice(x)
        if choice is None:
            return not use_triton(x)
        return choice["impl"] in ("triton", "ring", "exp12")

    def fold(self, x: torch.Tensor, norm: RowNorm | None = None, residual: torch.Tensor | None = None,
             glu: bool = False, out_dtype: torch.dtype | None = None, greedy: quant.GreedyIds | None = None,
             gelu: bool = False, sums: bool = False):
        """The product with the norm before it and the residual add after it in its epilogue
        (where `folds(x)`): x's rows scale by `norm`'s 1 / rms (the norm's weight is folded into
        this weight), and a LayerNorm's rows are centred too (by `centre`; its bias is in this
        product's); with `residual`, returns (residual + the product, its partial sums of
        squares, and with `sums` of its values: [2, tiles, M]), the stream and the next product's
        RowNorm (RowNorm.of). `out_dtype` as in `__call__`. `greedy`: each row's argmax of the
        result too, from the split-K kernel's epilogue (else by argmax_rows after the ring's).
        `gelu`: gelu_tanh of the result, in the split-K kernel's epilogue (after the ring's, a
        kernel)."""
        choice = self._choice(x)
        if choice is not None and choice["impl"] == "exp12":
            if (glu == self.exp12.glu and greedy is None and not gelu and out_dtype is None and not sums
                    and (norm is None or norm.sums is None)):  # an RMSNorm's fold, not a LayerNorm's
                return quant.exp12_linear(x, self.exp12, self.bias, choice["config"], norm=norm, residual=residual)
            choice = None  # a fold the 12-bit kernel does not take: the default path
        if choice is not None and choice["impl"] == "ring":
            y = quant.ring_linear(x, self.weight, self.bias, choice["config"], glu=glu, out_dtype=out_dtype,
                                  norm=norm, residual=residual, centre=self.centre, sums=sums)
            if greedy is not None:
                greedy.take(y)
            return activation.gelu_tanh(y) if gelu else y
        return quant.small_m_linear(x, self.weight, self.scale, self.bias, choice and choice["config"], glu=glu,
                                    out_dtype=out_dtype, norm=norm, residual=residual, greedy=greedy, gelu=gelu,
                                    centre=self.centre, sums=sums)

    def fused(self, x: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
              residual: torch.Tensor | None = None, glu: bool = False, norm_bias: torch.Tensor | None = None,
              gelu: bool = False, add: torch.Tensor | None = None,
              add_bias: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """RMSNorm(x + residual) (LayerNorm with `norm_bias`) -> this linear (-> silu(gate) * up
        when `glu`, GELU when `gelu`; + `add` before the bias), in one GEMV kernel when
        `uses_gemv(x)` (gemv.fused_linear); returns (output, x + residual or None)."""
        choice = self._choice(x)
        config = choice["config"] if choice is not None and self._runs_gemv(x, choice) else None
        return gemv.fused_linear(x, self.weight, self.scale, self.bias if add_bias else None, norm_weight, residual,
                                 eps, glu, config=config, norm_bias=norm_bias, gelu=gelu, add=add)


def cublas_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  out_dtype: torch.dtype | None = None, gelu: bool = False) -> tuple[torch.Tensor, bool]:
    """(x @ W.T (+ bias), whether GELU was applied) by cuBLAS, its epilogue taking on, on a GPU:
    - fp32 results of bf16/fp16 operands where there is no bias (torch.mm's `out_dtype`): the
      head's logits need no conversion kernel after it (95 us a step at 256 rows of Llama-3-8B).
      With a bias, addmm's form fills the output with it first, a kernel as slow as the
      conversion at GPT-J's head, so a biased head keeps the conversion.
    - GELU (tanh) after the bias, for bf16/fp16 (cuBLASLt's epilogue, as torch._addmm_activation
      runs it; it rounds once, where the product and then the activation kernel round twice).
    Elsewhere F.linear and False: the caller applies GELU and converts."""
    if not (x.is_cuda and x.dim() == 2):
        return F.linear(x, weight, bias), False
    if out_dtype == torch.float32 and x.dtype in (torch.float16, torch.bfloat16) and bias is None and not gelu:
        return torch.mm(x, weight.t(), out_dtype=torch.float32), False
    if gelu and bias is not None and out_dtype in (None, x.dtype) and x.dtype in (torch.float16, torch.bfloat16):
        return torch._addmm_activation(bias, x, weight.t(), use_gelu=True), True
    return F.linear(x, weight, bias), False


class VocabParallelEmbedding:
    """Rank r holds rows [r*n, (r+1)*n) of the (padded) vocabulary; other ids contribute zeros."""

    def __init__(self, weight: torch.Tensor, tp: TPGroup) -> None:
        self.weight, self.tp = weight, tp
        self.start = tp.rank * weight.shape[0]

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        x = F.embedding(local.masked_fill(outside, 0), self.weight)  # (T, H)
        x = x.masked_fill(outside[:, None], 0.0)
        return self.tp.all_reduce(x)
