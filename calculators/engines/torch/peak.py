"""Peak memory of one training step under PyTorch's engines, phase by phase.

The step the ``torch`` engine models (and ``measure/`` runs) is a plain training loop::

    logits = model(x)                       # autocast (DDP) or MixedPrecisionPolicy (FSDP2)
    loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

``logits`` and ``loss`` stay referenced until the next iteration rebinds them, so they are part
of what is allocated between steps (``held_outputs``); ``engine_config["holds_outputs"] = false``
models a loop that deletes them. The peak is the largest of these moments, each one a sum of
tensors whose lifetimes come from autograd and the engines' source:

- ``loss_backward``: everything forward saved (``calculators.activations``), the unsharded
  16-bit parameters FSDP2 keeps after forward when ``reshard_after_forward=False``, and the two
  fp32 ``tokens × vocab`` gradients of the loss (nll_loss's grad input and log_softmax's).
- ``loss_forward`` and ``last_block_gather`` (FSDP2, the last block's all-gather in forward)
  also find the last step's ``logits`` and ``loss``: the loop rebinds them only when forward
  returns; so does ``first_block_gather`` (FSDP2, block 0's all-gather, the root's flat output
  still kept beside the root's parameters).
- ``final_norm_forward`` (transformers' modelling code): the final norm's last op in forward,
  before the head has made any logits: every block's saved tensors, the norm's input, what it
  saves, its output and (16-bit) an fp32 local; with a small vocabulary it outgrows the loss.
- ``last_block_forward`` (FSDP2, eager attention): the last block's softmax in forward, its
  flat all-gather output still kept, the previous block's freed.
- ``recompute`` (activation checkpointing): the first block recomputed in backward, at the
  largest moment inside its backward (below).
- ``final_norm_backward`` (transformers' modelling code): the final norm's backward after the
  head's, every layer's activations still saved, the norm's fp32 temporaries alive.
- ``layer_backward`` (transformers' modelling code, DDP, the last layer not checkpointed): the
  largest moment inside the last layer's backward (below), the loss's and the head's saved
  tensors freed.
- ``block_backward`` (FSDP2): the end of a block's backward, before its post-backward hook
  reshards it (:class:`FsdpBackward`): the root unit gathered again for the head's backward and
  kept until backward ends, the head's gradient, the block's parameters and gradients, the next
  block prefetched, the previous block's reduce-scatter input, the shards already reduced and
  the activations of the blocks still to run backward; with ``reshard_after_forward=True``
  also each block's pre-backward, when its prefetched flat all-gather output and its
  unsharded parameters (both padded to N rows: 3-D expert weights with fewer experts than N
  grow N / E-fold) are alive together; and each block at the moments inside its backward.
  Each block counts its own sizes (DeepSeek's dense blocks are smaller than its experts
  blocks). On one rank FSDP2 makes no flat all-gather output and prefetches nothing: each
  unit's shards are copied into its parameters when its pre-forward or pre-backward waits.
- Inside a layer's backward (``transformers_activations``): its MLP's or experts' first ops with
  their gradients (``dense_layer_backward``, ``experts_backward``), the norms between MLP and
  attention with the MLP's weight gradients made (``norms_backward``), an eager attention's (or
  SDPA's fp32 math path's) score gradients (``eager_attention_backward``), or in fp32 the
  memory-efficient kernel's gradients and workspace (``efficient_attention_backward``, beside
  the MLP's rather than above it), and at its end the
  input norm's backward with every weight gradient of the layer made (``input_norm_backward``):
  each an RMSNorm's backward holds up to five fp32 tensors of the norm's size at once.
- ``optimizer_step``: the gradients the optimizer reads plus one temporary list the size of
  the local parameters that torch's foreach Adam allocates (``torch/optim/adam.py``
  ``_multi_tensor_adam``: ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)``).

Runtime allocations that ``torch.cuda.memory_allocated`` also counts: the cuBLAS workspaces,
one per (handle, stream), and a handle per thread — the forward runs in the caller's thread and
backward in autograd's device thread, so two. Their size is ``4096 × 8 KiB`` = 32 MiB on sm_90
and newer (``aten/src/ATen/cuda/CublasHandlePool.cpp``, ``parseChosenWorkspaceSize``), else
``4096 KiB × 2 + 16 KiB × 8``. A model with biased linears also makes the 1 MiB cuBLASLt
workspace (:data:`CUBLASLT_WORKSPACE`), two under activation checkpointing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from calculators.activations import ActivationBreakdown, Regime, activations
from calculators.architecture import Architecture, Norm, dense_layers
from calculators.batch import Batch, Checkpointing
from calculators.conventions import FP32_BYTES, HALF_BYTES
from calculators.errors import InputError
from calculators.transformers_activations import (
    attention_core_backward,
    dense_layer_backward,
    eager_attention_backward,
    eager_softmax_forward,
    experts_backward,
    experts_product_backward,
    final_hidden_state,
    final_norm_forward,
    final_norm_held,
    input_norm_backward,
    norms_backward,
)

KIB = 1024
CUBLAS_WORKSPACE_SM90 = 4096 * 8 * KIB
CUBLAS_WORKSPACE_OLDER = 4096 * KIB * 2 + 16 * KIB * 8
CUBLAS_HANDLES = 2  # the caller's thread (forward, step) and autograd's device thread (backward)
DEFAULT_COMPUTE_CAPABILITY = 9  # H100 / H200


def cublas_workspace_bytes(config: Mapping[str, Any]) -> int:
    """Workspaces the caching allocator holds after the first step (0 on CPU)."""
    if "cublas_workspace_bytes" in config:
        value = config["cublas_workspace_bytes"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError("engine_config.cublas_workspace_bytes", "must be a byte count >= 0")
        return value
    major = config.get("compute_capability_major", DEFAULT_COMPUTE_CAPABILITY)
    if isinstance(major, bool) or not isinstance(major, int) or major < 1:
        raise InputError("engine_config.compute_capability_major", "must be an integer >= 1")
    per_handle = CUBLAS_WORKSPACE_SM90 if major >= 9 else CUBLAS_WORKSPACE_OLDER
    return CUBLAS_HANDLES * per_handle


# torch's cuBLASLt workspace, CUBLASLT_WORKSPACE_SIZE default 1024 KiB
# (aten/src/ATen/cuda/CublasHandlePool.cpp parseCUDABlasLtWorkspaceSize). It is allocated
# through the caching allocator by the first addmm with a bias epilogue (gemm_and_bias), which
# is what F.linear on a biased nn.Linear runs in forward; an unbiased model never makes it. One
# is kept per (cuBLAS handle, stream) (getCUDABlasLtWorkspace), and handles are per thread: a
# forward recomputed by activation checkpointing runs in autograd's device thread and makes a
# second one there.
CUBLASLT_WORKSPACE = 1024 * 1024


def runs_biased_linear(arch: Architecture | None) -> bool:
    """Whether forward runs an ``nn.Linear`` with a bias (``addmm``'s bias epilogue)."""
    return arch is not None and (arch.bias or arch.has_qkv_bias or arch.lm_head_bias)


def biased_linear_threads(arch: Architecture | None, batch: Batch | None) -> int:
    """Threads whose biased linears make a cuBLASLt workspace: the caller's forward, and
    autograd's device thread where checkpointed blocks run forward again (0: no biased
    linear)."""
    if not runs_biased_linear(arch):
        return 0
    recompute = batch is not None and batch.activation_checkpointing is Checkpointing.FULL
    return 2 if recompute else 1


def cublaslt_workspace_bytes(
    config: Mapping[str, Any], arch: Architecture | None, batch: Batch | None
) -> int:
    """The cuBLASLt workspaces the step's biased linears make (0 without one, or on CPU)."""
    if "cublaslt_workspace_bytes" in config:
        value = config["cublaslt_workspace_bytes"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError("engine_config.cublaslt_workspace_bytes", "must be a byte count >= 0")
        return value
    return CUBLASLT_WORKSPACE * biased_linear_threads(arch, batch)


# transformers' Trainer keeps the loss alone: ``training_step`` calls ``compute_loss``, which
# returns ``outputs["loss"]``, so the model output, logits included, dies as it returns, before
# ``accelerator.backward(loss)``; between steps the loop keeps ``loss.detach()`` only.
TRAINER_LOOP = "trainer_loop"


def trainer_loop(config: Mapping[str, Any], arch: Architecture | None = None) -> bool:
    """Whether the loop keeps only the loss from forward, as transformers' Trainer does (its
    model computes the loss from ``labels``, so ``arch`` must be a transformers model)."""
    value = config.get(TRAINER_LOOP, False)
    if not isinstance(value, bool):
        raise InputError(f"engine_config.{TRAINER_LOOP}", "must be true or false")
    if value and arch is not None and arch.modelling is None:
        raise InputError(
            f"engine_config.{TRAINER_LOOP}",
            "transformers' Trainer trains a transformers model, whose forward computes the loss "
            "from labels: give the model as hf_config or a preset of a transformers family",
        )
    return value


def holds_outputs(config: Mapping[str, Any]) -> bool:
    """Whether the loop keeps its last logits and loss between steps (never under
    :data:`TRAINER_LOOP`)."""
    trainer = trainer_loop(config)
    value = config.get("holds_outputs", not trainer)
    if not isinstance(value, bool):
        raise InputError("engine_config.holds_outputs", "must be true or false")
    if value and trainer:
        raise InputError(
            "engine_config.holds_outputs",
            f"contradicts {TRAINER_LOOP}: transformers' Trainer keeps the loss alone",
        )
    return value


# accelerate's Accelerator.prepare_model, under bf16/fp16 mixed precision on every engine but
# DeepSpeed (``native_amp``), replaces the model's forward with
# ``convert_outputs_to_fp32(autocast(forward))`` (accelerator.py; utils/operations.py
# ``convert_to_fp32``: ``tensor.float()`` for every 16-bit tensor in the output). transformers'
# Trainer and ``accelerate launch`` loops train through it, FSDP2 included.
CONVERT_OUTPUTS = "convert_outputs_to_fp32"


def converts_outputs(config: Mapping[str, Any]) -> bool:
    """Whether forward returns its 16-bit outputs as fp32 copies (accelerate's wrapper)."""
    value = config.get(CONVERT_OUTPUTS, False)
    if not isinstance(value, bool):
        raise InputError(f"engine_config.{CONVERT_OUTPUTS}", "must be true or false")
    return value


def returned_activations(
    acts: ActivationBreakdown, regime: Regime, fp32_outputs: bool, dropped: bool = False
) -> ActivationBreakdown:
    """``acts`` as the loop finds them once the model has returned: under accelerate's
    ``convert_outputs_to_fp32`` (``fp32_outputs``, mixed precision) the caller holds an fp32
    copy of the 16-bit logits, made as forward returns, and the 16-bit logits die with the
    model output they came in (nothing saved them: ``logits.float()``'s backward keeps no
    input). A loop that keeps only the loss (``dropped``, :data:`TRAINER_LOOP`) holds no
    logits at all."""
    if dropped:
        return replace(acts, logits=0)
    if regime is Regime.FP32 or not fp32_outputs:
        return acts
    return replace(acts, logits=acts.logits * FP32_BYTES // HALF_BYTES)


@dataclass(frozen=True)
class StepMemory:
    """Memory of one step beyond the engine's model states.

    Attributes:
        activations: what forward saves for backward, at the end of forward.
        held_outputs: ``logits`` and ``loss`` of the last step, alive between steps.
        workspaces: cuBLAS workspaces in the caching allocator.
        end_of_forward: bytes above model states when forward and the loss are done
            (activations plus parameters still gathered).
        step_gradients: gradient bytes alive from the end of backward through the step.
        moments: bytes above model states + workspaces at each candidate moment.
        peak_moment: which moment is the peak.
        offloaded: host bytes checkpoint offload packs the layers' inputs into.
    """

    activations: int
    held_outputs: int
    workspaces: int
    end_of_forward: int = 0
    step_gradients: int = 0
    moments: Mapping[str, int] = field(default_factory=dict)
    offloaded: int = 0

    @property
    def peak_moment(self) -> str:
        return max(self.moments, key=lambda k: self.moments[k])

    @property
    def above_states(self) -> int:
        return self.moments[self.peak_moment]


@dataclass(frozen=True)
class FsdpBlock:
    """One block's part in :class:`FsdpBackward`, in bytes.

    Attributes:
        gathered: the block's unsharded parameters (``N × padded shard``, compute dtype).
        grads: its unsharded gradients (compute dtype).
        reduce_input: its reduce-scatter input (``N × padded shard``, reduce dtype).
        shard_grad: its reduced gradient shard (padded shard, reduce dtype).
        cast_output: its 16-bit reduce-scatter output, alive while it is cast to the fp32 shard
            (``reduce_dtype`` the param dtype; 0: the output is the shard).
        gather_inputs: ``CPUOffloadPolicy``: its all-gather inputs, its shards copied up from
            the CPU and cast to the compute dtype (padded shard), alive while the unsharded
            storage they are copied into is allocated (0: no offload; the shards on the device
            are copied straight into it).
        grads_before_attention: the part of ``grads`` autograd has made by the block's
            attention core's backward: its MLP's, output projection's and post-attention norms'
            gradients (an eager attention's or the memory-efficient kernel's backward runs
            beside them).
    """

    gathered: int
    grads: int
    reduce_input: int
    shard_grad: int
    cast_output: int = 0
    gather_inputs: int = 0
    grads_before_attention: int = 0


@dataclass(frozen=True)
class FsdpBackward:
    """What FSDP2 holds while autograd runs backward through the blocks, in bytes.

    The root's pre-backward hook sits on the model's output (``_fsdp_state.py``
    ``_register_pre_backward_hook``), so the root unit is gathered before the head's backward
    whether the loss is computed inside the model or after it, and its post-backward runs only
    from the final callback (its inputs are token ids): the root stays gathered, and the
    gradients of the parameters after the blocks (final norm, head) stay unsharded, through
    every block's backward (``_fsdp_param_group.py`` ``pre_backward`` / ``post_backward``).
    A block's post-backward reshards it, then drops the previous block's reduce-scatter
    input (``comm_ctx.reduce_scatter_state``), so until then that input is alive beside the
    block's own parameters and gradients. Blocks of unlike kinds (DeepSeek's dense blocks
    before its experts blocks) hold unlike amounts: each moment of block ``i`` reads its own
    terms and its neighbours'.

    Attributes:
        blocks: the blocks in forward order as runs of alike ones: ``(how many, their terms)``.
        root_gathered: the root unit's unsharded parameters (``N × padded shard``, compute dtype).
        root_grads: unsharded gradients of the root's parameters after the blocks.
        prefetch: ``reshard_after_forward=True``: each block is gathered again for backward and
            the next one prefetched; ``False``: the blocks not yet run backward stay gathered.
        embedding_grads: what the token embedding's backward adds to the root's gradients:
            its dense weight gradient, and where the head is tied to it the sum autograd makes
            of that and the head's gradient (``InputBuffer``, out of place), all three alive.
        keeps_shards: whether each reduced gradient shard stays on the device (``False`` under
            ``CPUOffloadPolicy``: each is copied to the CPU as it is made, the device copy freed).
        grad_element_bytes: bytes per element of the unsharded gradients (compute dtype).
        across_ranks: whether the all-gather spans ranks (N > 1). A world of one rank makes no
            flat all-gather output and its prefetch allocates nothing: a block's pre-backward
            copies each shard into its unsharded storage when it waits for it
            (``_fsdp_param_group.py`` ``unshard`` and ``wait_for_unshard``, ``world_size == 1``).
    """

    blocks: tuple[tuple[int, FsdpBlock], ...]
    root_gathered: int
    root_grads: int
    prefetch: bool
    embedding_grads: int = 0
    keeps_shards: bool = True
    grad_element_bytes: int = HALF_BYTES
    across_ranks: bool = True

    @property
    def layers(self) -> int:
        """Blocks, each its own FSDP2 unit."""
        return sum(n for n, _ in self.blocks)

    def block(self, i: int) -> FsdpBlock:
        """Block ``i``'s terms."""
        for n, b in self.blocks:
            if i < n:
                return b
            i -= n
        raise IndexError(i)

    def candidates(self) -> set[int]:
        """The blocks where a moment's largest value can lie: each term is linear in the block
        inside a run of alike blocks whose neighbours are alike too, so the first two and the
        last two of each run."""
        out: set[int] = set()
        start = 0
        for n, _ in self.blocks:
            end = start + n - 1
            out |= {start, min(start + 1, end), max(end - 1, start), end}
            start += n
        return out

    def inner_runs(self) -> list[range]:
        """The blocks of each run between its first two and last two (:meth:`candidates`), on
        which every moment is linear in the block."""
        out, start = [], 0
        for n, _ in self.blocks:
            if n > 4:
                out.append(range(start + 2, start + n - 2))
            start += n
        return out

    def at_block_start(self, i: int, accumulated_gradients: int) -> int:
        """Bytes FSDP2 holds when block ``i``'s backward starts (no gradient of it yet)."""
        return self.at_block_end(i, accumulated_gradients) - self.block(i).grads

    def at_block_end(self, i: int, accumulated_gradients: int) -> int:
        """Bytes FSDP2 holds at the end of block ``i``'s backward (blocks run L-1 down to 0)."""
        own = self._gathered(i, True) + self.block(i).grads + self._held_input(i)
        return own + self._common(i, accumulated_gradients)

    def at_final_norm(self, accumulated_gradients: int) -> int:
        """Bytes FSDP2 holds during the final norm's backward, before any block's: the root
        gathered again with its gradients, and the blocks still gathered since forward where
        they are not resharded after it (``prefetch`` false); with ``prefetch`` the last block,
        which the root's pre-backward prefetches (it ran forward last)."""
        if not self.prefetch:
            blocks = sum(n * b.gathered for n, b in self.blocks)
        else:
            blocks = self.block(self.layers - 1).gathered if self.across_ranks else 0
        return self.root_gathered + self.root_grads + blocks + accumulated_gradients

    def at_reduce(self, i: int, accumulated_gradients: int) -> int:
        """Bytes FSDP2 holds while block ``i``'s post-backward copies its gradients into the
        reduce-scatter input: the block resharded, the previous input dropped."""
        b = self.block(i)
        own = self._gathered(i, False) + b.grads + b.reduce_input
        return own + self._common(i, accumulated_gradients)

    def at_cast(self, i: int, accumulated_gradients: int) -> int:
        """Bytes FSDP2 holds while block ``i``'s 16-bit reduce-scatter output is cast to its
        fp32 shard (``_to_dtype_if_needed``): as :meth:`at_reduce`, the unsharded gradients
        freed after the copy-in, both outputs alive."""
        b = self.block(i)
        return self.at_reduce(i, accumulated_gradients) - b.grads + b.cast_output + b.shard_grad

    def at_embedding(self, accumulated_gradients: int) -> int:
        """Bytes FSDP2 holds during the token embedding's backward, after every block's: the
        root still gathered (its post-backward runs from the final callback), the gradients
        of the root's parameters, block 0's reduce-scatter input and every block's shard."""
        common = self._common(-1, accumulated_gradients)
        return common + self.embedding_grads + self.block(0).reduce_input

    def at_gather(self, i: int, accumulated_gradients: int) -> int:
        """Bytes FSDP2 holds while block ``i``'s pre-backward copies its prefetched all-gather
        out (``wait_for_unshard``, ``foreach_all_gather_copy_out``): the flat all-gather output
        and the block's unsharded parameters both ``N × padded shard``, the next block's
        reduce-scatter input, no gradient of block ``i`` yet, block ``i - 1`` not yet
        prefetched (``pre_backward`` prefetches after the wait). Only where blocks are
        gathered again for backward (``reshard_after_forward=True``). A world of one copies
        the shards (copied up from the CPU under ``CPUOffloadPolicy``) into the unsharded
        storage: no flat output."""
        b = self.block(i)
        source = b.gathered if self.across_ranks else b.gather_inputs
        own = b.gathered + source + self._held_input(i)
        return own + self._common(i, accumulated_gradients)

    def at_prefetch(self, i: int, accumulated_gradients: int) -> int:
        """Bytes FSDP2 holds when block ``i``'s pre-backward, its copy-out done (the flat output
        freed), prefetches block ``i - 1`` under ``CPUOffloadPolicy``: the inputs copied up from
        the CPU and block ``i - 1``'s flat output beside block ``i``'s parameters (0 for block 0,
        which prefetches nothing, without offload, where no inputs are made, and in a world of
        one, whose prefetch allocates nothing)."""
        if i == 0 or not self.across_ranks:
            return 0
        before = self.block(i - 1)
        if not before.gather_inputs:
            return 0
        own = self.block(i).gathered + before.gathered + before.gather_inputs
        return own + self._held_input(i) + self._common(i, accumulated_gradients)

    def _held_input(self, i: int) -> int:
        """Block ``i + 1``'s reduce-scatter input, alive until block ``i``'s post-backward (none
        after the last block)."""
        return self.block(i + 1).reduce_input if i < self.layers - 1 else 0

    def _gathered(self, i: int, with_block: bool) -> int:
        own = self.block(i).gathered if with_block else 0
        if self.prefetch:  # block i-1 prefetched (none below block 0 or in a world of one)
            return own + (self.block(i - 1).gathered if i > 0 and self.across_ranks else 0)
        return own + self._sum_below(i, lambda b: b.gathered)  # still gathered since forward

    def _common(self, i: int, accumulated_gradients: int) -> int:
        """The root's parameters and gradients, and the reduced shards of the blocks after
        ``i`` (or the accumulated gradients)."""
        kept = 0
        if self.keeps_shards:
            kept = self._sum_below(self.layers, lambda b: b.shard_grad)
            kept -= self._sum_below(i + 1, lambda b: b.shard_grad)
        return self.root_gathered + self.root_grads + (accumulated_gradients or kept)

    def _sum_below(self, i: int, term: Callable[[FsdpBlock], int]) -> int:
        """``term`` summed over blocks ``0 .. i - 1``."""
        total = 0
        for n, b in self.blocks:
            total += min(n, max(i, 0)) * term(b)
            i -= n
        return total


@dataclass(frozen=True)
class DdpBackwardGrads:
    """The ``param.grad`` bytes DDP's backward has made by each block (see
    ``memory._ddp_backward_grads``): the head's and the final norm's, one block's, and the part
    of a block's made before its attention core's backward, and the bytes per element of a
    gradient."""

    root: int
    block: int
    block_before_attention: int
    element_bytes: int


def step_memory(
    arch: Architecture,
    batch: Batch,
    regime: Regime,
    *,
    ddp_grads: DdpBackwardGrads | None = None,
    unsharded_after_forward: int,
    step_gradients: int,
    optimizer_temporary: int,
    accumulated_gradients: int = 0,
    gathered_for_loss: int = 0,
    root_copy_out: int = 0,
    root_reduction: int = 0,
    fsdp_backward: FsdpBackward | None = None,
    forward_gathered: int = 0,
    in_last_block: int = 0,
    last_gather: int = 0,
    first_gather: int = 0,
    fp32_outputs: bool = False,
    config: Mapping[str, Any],
) -> StepMemory:
    """The moments of one step, in bytes above the resident model states.

    Args:
        arch: the decoder.
        batch: the micro-batch.
        regime: dtypes during forward (``autocast`` for DDP, ``half`` for FSDP2 mixed).
        unsharded_after_forward: 16-bit parameter bytes still gathered when forward ends.
        step_gradients: gradient bytes alive during the optimizer step (beyond buckets).
        optimizer_temporary: bytes of the optimizer's temporaries during step.
        accumulated_gradients: gradients already held when a later micro-batch's loss runs
            backward (gradient accumulation).
        gathered_for_loss: 16-bit parameter bytes gathered again before the loss's backward
            (FSDP2 with ``reshard_after_forward=True`` when the loss is the root's output).
        root_copy_out: bytes alive while the root's pre-backward copies its gathered
            parameters out of the flat all-gather output, both together (FSDP2 with the root
            resharded after forward; 0: none).
        root_reduction: bytes of gradients alive when FSDP2 reduces its root unit at the end of
            backward (0: no such moment).
        fsdp_backward: what FSDP2 holds during the blocks' backward (``None``: not FSDP2).
        forward_gathered: FSDP2's gathered parameter bytes at the last block's all-gather in
            forward, its flat all-gather output and the previous block's included (0: none).
        in_last_block: FSDP2's gathered parameter bytes while the last block runs forward: its
            flat all-gather output still kept, the previous block's freed by its copy-out
            (0: none).
        last_gather: the flat all-gather output still alive while a loss inside the root
            module runs (0: none).
        first_gather: FSDP2's gathered bytes at block 0's all-gather in forward: the root's
            parameters and flat all-gather output, block 0's flat output and parameters (0:
            none).
        fp32_outputs: forward returns fp32 copies of its 16-bit outputs (accelerate's
            ``convert_outputs_to_fp32`` under mixed precision).
        config: engine knobs (``holds_outputs``, ``cublas_workspace_bytes``).
        ddp_grads: DDP's gradients made as backward goes (``None``: not DDP, or not a
            transformers model); counted on the first micro-step, where they are not all
            alive already.
    """
    inside = activations(arch, batch, regime)
    # from here on, the activations as the loop holds them after the model returned
    acts = returned_activations(inside, regime, fp32_outputs, trainer_loop(config, arch))
    converted = acts is not inside
    # logits + the loss scalar; a transformers model's key/value cache dies with its output
    # object, which the loop (like transformers' Trainer) does not keep: it is alive only while
    # the model computes the loss from ``labels`` (``loss_forward``)
    held = acts.logits + FP32_BYTES if holds_outputs(config) else 0
    loss_grads = 2 * FP32_BYTES * batch.tokens * arch.vocab_size
    end_of_forward = unsharded_after_forward + acts.end_of_forward
    if arch.modelling is not None:
        # the loss from ``labels`` runs inside the model, on the 16-bit logits; an fp32 copy
        # made as forward returns (``converted``) replaces its transient fp32 copy of the
        # logits byte for byte beside the same tensors, so that moment is never higher
        # inside the autocast region, whose cast cache still holds the checkpointed layers'
        # weight copies, and the model's output object still holds the final norm's output
        loss_forward = (
            unsharded_after_forward
            + inside.end_of_forward
            + inside.loss_transient
            + inside.cast_cache
            + final_hidden_state(arch, batch, regime.value)
        )
    else:
        # the caller's ``cross_entropy(logits.float())``: on converted fp32 logits ``.float()``
        # returns the tensor itself, no transient copy
        loss_forward = end_of_forward + (0 if converted else acts.loss_transient)
    # the loop rebinds ``logits, loss`` only when the model returns, so the last step's outputs
    # are alive through every moment of this step's forward
    moments = {
        "loss_forward": loss_forward + acts.cache_only + last_gather + held,
        "loss_backward": end_of_forward + loss_grads + accumulated_gradients + gathered_for_loss,
        "optimizer_step": held + step_gradients + optimizer_temporary,
    }
    if arch.modelling is not None:
        # the final norm's last op, before the head: every block's saved tensors, the norm's
        # own (with its input and an fp32 local), the autocast cache, the last step's outputs
        moments["final_norm_forward"] = (
            unsharded_after_forward
            + acts.layers
            + acts.embedding
            + acts.autocast_weights
            + inside.cast_cache
            + acts.cache_only
            + last_gather
            + held
            + final_norm_forward(arch, batch, regime.value)
        )
    if forward_gathered:
        # the blocks before the last one have saved theirs; the hidden state entering the last
        # block is alive and saved by nothing yet, and transformers' decoder keeps
        # ``inputs_embeds`` (the embedding's output) as a local until its forward returns
        # (``hidden_states = inputs_embeds``, then rebinding ``hidden_states`` per layer),
        # which only a checkpointed first layer saves as its input (on the device: offload
        # packs the saved one into host memory, the local stays)
        res = FP32_BYTES if regime is Regime.AUTOCAST or regime is Regime.FP32 else HALF_BYTES
        hidden = res * batch.tokens * arch.hidden
        embeds = arch.modelling is not None and (
            batch.activation_checkpointing is not Checkpointing.FULL or batch.checkpoint_offload
        )
        moments["last_block_gather"] = (
            forward_gathered
            + acts.layers
            - acts.saved(arch.layers - 1, arch.layers)
            + acts.embedding
            + hidden
            + (hidden if embeds else 0)
            + held
        )
        softmax = eager_softmax_forward(arch, batch, regime.value)
        if in_last_block and softmax:
            # then the last block's eager attention runs its softmax
            moments["last_block_forward"] = (
                moments["last_block_gather"] - forward_gathered + in_last_block + softmax
            )
    if first_gather:
        # forward has run the token embedding only: its output (the hidden state entering
        # block 0) and what it saved, beside the last step's outputs the loop still holds
        res = FP32_BYTES if regime is Regime.AUTOCAST or regime is Regime.FP32 else HALF_BYTES
        moments["first_block_gather"] = (
            first_gather + acts.embedding + res * batch.tokens * arch.hidden + held
        )
    if root_copy_out:
        # the root's pre-backward hook sits on its outputs: on the loss a transformers model
        # returns, it runs before any gradient is made; on the logits of a model whose loss the
        # caller computes, after the loss's backward, its saved tensors freed and the logits'
        # gradient made
        after_loss = 0 if arch.modelling is not None else acts.logits - acts.loss
        moments["root_backward_gather"] = (
            end_of_forward + after_loss + root_copy_out + accumulated_gradients
        )
    if root_reduction:
        moments["root_reduction"] = held + root_reduction + accumulated_gradients
    # a layer's inner moment depends on the block only through its kind (dense or experts)
    inner_of: dict[tuple[int, bool | None], int] = {}

    def inner(kept: int, block: int | None = None) -> int:
        key = (kept, None if block is None else _dense_block(arch, block))
        if key not in inner_of:
            inner_of[key] = _layer_inner(arch, batch, regime, kept, block)
        return inner_of[key]

    if fsdp_backward is not None and fsdp_backward.layers:
        moments["block_backward"] = _block_backward(
            arch, batch, regime, acts, fsdp_backward, accumulated_gradients, inner
        )
    eager = eager_attention_backward(arch, batch, regime.value) if arch.modelling else 0
    # the attention core's backward: eager's (or the math path's), or the memory-efficient
    # kernel's (fp32 SDPA), which is a candidate beside the MLP's rather than above it
    core = attention_core_backward(arch, batch, regime.value)
    # DDP's gradients made as backward goes (first micro-step); with eager attention a block's
    # own before its attention core are counted with that moment
    first_made = ddp_grads is not None and not accumulated_gradients
    made_bytes = ddp_grads.element_bytes if ddp_grads is not None and first_made else 0
    root_made = ddp_grads.root if ddp_grads is not None and first_made else 0

    if arch.modelling is not None:
        # the final norm's backward, after the head's: the loss's and the head's saved tensors
        # freed, every layer's still saved
        final = final_norm_held(arch, batch, regime.value)
        fs = fsdp_backward
        if fs is not None and fs.layers:
            moments["final_norm_backward"] = (
                acts.logits
                + acts.embedding
                + acts.layers
                + final
                + fs.at_final_norm(accumulated_gradients)
            )
        else:
            moments["final_norm_backward"] = (
                end_of_forward - acts.head - acts.loss + final + accumulated_gradients + root_made
            )
    # the last layer runs backward as it ran forward where it is not checkpointed
    top_plain = not acts.recomputed(arch.layers - 1)
    fsdp_blocks = fsdp_backward is not None and fsdp_backward.layers
    if arch.modelling is not None and top_plain and not fsdp_blocks:
        # the last layer's backward: the head's and the loss's saved tensors are freed, the
        # residual stream's gradient enters the layer; then its eager attention's backward
        res = FP32_BYTES if regime is Regime.AUTOCAST or regime is Regime.FP32 else HALF_BYTES
        entered = (
            end_of_forward
            - acts.head
            - acts.loss
            + res * batch.tokens * arch.hidden
            + accumulated_gradients
        )
        moments["layer_backward"] = entered + root_made + inner(made_bytes, arch.layers - 1)
        if core:
            before = ddp_grads.block_before_attention if ddp_grads and first_made else 0
            made = root_made + before
            moments["attention_backward"] = entered + core + made
    if acts.recompute:
        # backward of the last checkpointed block: the saved block inputs, the caller's logits,
        # the recomputed block and the gradient flowing in and out of it.
        res = FP32_BYTES if regime is Regime.AUTOCAST or regime is Regime.FP32 else HALF_BYTES
        # an eager attention's backward inside the block, with the gradient entering it only
        # (the one leaving it is not made yet)
        in_block = core - res * batch.tokens * arch.hidden if core else 0
        recompute = (
            acts.layers
            + acts.embedding
            + acts.logits
            + acts.recompute
            + 2 * res * batch.tokens * arch.hidden
        )
        if fsdp_backward is not None and fsdp_backward.layers:
            # FSDP2 holds what it holds at the start of the block's backward (its gathered
            # parameters included); each block below the last finds the previous one's
            # reduce-scatter input and one more reduced shard, one saved input fewer: linear
            # in the block inside a run of alike blocks, so the largest is at one of the
            # candidates (FsdpBackward.candidates)
            fs = fsdp_backward
            # with every_n_layers only the checkpointed blocks run forward again, and the
            # blocks keep unlike amounts: each of them is a candidate
            recomputed = (
                fs.candidates()
                if acts.every_n_layers == 1
                else range(0, fs.layers, acts.every_n_layers)
            )

            def in_recompute(i: int) -> int:
                """FSDP2's and the saved blocks' part while block ``i`` is recomputed and runs
                backward; with transformers' modelling code, its experts' (or dense MLP's, or
                sandwich norm's) backward (no gradient leaves it yet), or its eager
                attention's (with the block's unsharded gradients made before its attention
                core)."""
                total = (
                    fs.at_block_start(i, accumulated_gradients)
                    - acts.saved_after(i, arch.layers)
                    + acts.plain_copies_below(i)
                )
                if arch.modelling is None:
                    return total
                layer = inner(fs.grad_element_bytes, i)
                before = fs.block(i).grads_before_attention
                attention = in_block + before if core else 0
                return total + max(layer - res * batch.tokens * arch.hidden, attention, 0)

            recompute += max(in_recompute(i) for i in recomputed)
        else:
            recompute += unsharded_after_forward + accumulated_gradients
            # the recomputed block k's eager attention, or its MLP's, experts' or norms'
            # backward, its MLP's gradients made (with eager attention the block's gradients
            # before its attention are added below)
            kept = 0 if eager else made_bytes
            t_h = res * batch.tokens * arch.hidden
            # the memory-efficient kernel's backward with the block's gradients made before it
            # (DDP's first micro-step), beside the MLP's with its own
            efficient = 0
            if core and not eager:
                made_before = ddp_grads.block_before_attention if ddp_grads and first_made else 0
                efficient = in_block + made_before

            def own(k: int) -> int:
                return max(in_block if eager else efficient, inner(kept, k) - t_h, 0)

            if acts.every_n_layers > 1:
                # block k's recomputation: what the blocks after it kept is freed and, on the
                # first micro-step under DDP, their gradients made (each block's the same)
                made = 0
                if ddp_grads is not None and not accumulated_gradients:
                    made = ddp_grads.block
                    recompute += ddp_grads.root + (ddp_grads.block_before_attention if eager else 0)
                # the layers below k that are not checkpointed still hold autocast's weight
                # copies they saved
                recompute += max(
                    (arch.layers - 1 - k) * made
                    - acts.saved_after(k, arch.layers)
                    + acts.plain_copies_below(k)
                    + own(k)
                    for k in range(0, arch.layers, acts.every_n_layers)
                )
            elif ddp_grads is not None and not accumulated_gradients:
                # block i's backward: the saved inputs of the blocks after it are gone, their
                # gradients made (linear in i: the largest at the first block, the first of
                # DeepSeek's experts blocks, or the last)
                eager_own = ddp_grads.block_before_attention if eager else 0
                net = ddp_grads.block - t_h
                first_moe = dense_layers(arch) if arch.num_experts > 1 else 0
                recompute += (
                    ddp_grads.root
                    + eager_own
                    + max(
                        own(i) + max(net * (arch.layers - 1 - i), 0)
                        for i in {0, min(first_moe, arch.layers - 1), arch.layers - 1}
                    )
                )
            else:
                recompute += max(own(0), own(arch.layers - 1))
        moments["recompute"] = recompute
    return StepMemory(
        activations=acts.end_of_forward,
        held_outputs=held,
        workspaces=cublas_workspace_bytes(config) + cublaslt_workspace_bytes(config, arch, batch),
        end_of_forward=end_of_forward,
        step_gradients=step_gradients,
        moments=moments,
        offloaded=inside.offloaded,
    )


def _dense_block(arch: Architecture, block: int) -> bool:
    """Whether block ``block`` has a dense MLP (DeepSeek's first blocks; every block of a dense
    model)."""
    return arch.num_experts <= 1 or block < dense_layers(arch)


def _layer_inner(
    arch: Architecture, batch: Batch, regime: Regime, kept: int, block: int | None = None
) -> int:
    """A layer's MLP's, experts' or the norms' backward between MLP and attention at its largest,
    beyond its saved tensors and the gradient entering it (0: not a transformers model).
    ``kept``: bytes per element of the MLP's weight gradients made by then and counted nowhere
    else; ``block``: that block's kind (DeepSeek's first blocks are dense), by default the
    largest of the model's kinds."""
    if arch.modelling is None:
        return 0
    dense = None if block is None else _dense_block(arch, block)
    return max(
        experts_backward(arch, batch, regime.value) if dense is not True else 0,
        experts_product_backward(arch, batch, regime.value, kept) if dense is not True else 0,
        dense_layer_backward(arch, batch, regime.value) if dense is not False else 0,
        norms_backward(arch, batch, regime.value, kept, dense),
    )


def _block_backward(
    arch: Architecture,
    batch: Batch,
    regime: Regime,
    acts: ActivationBreakdown,
    fsdp: FsdpBackward,
    accumulated_gradients: int,
    inner: Callable[[int, int], int],
) -> int:
    """The largest moment of the blocks' backward under FSDP2 (:class:`FsdpBackward`);
    ``inner(kept, i)``: :func:`_layer_inner` of block ``i``.

    Instants of each block ``i``. At the end of its backward autograd still holds what blocks
    ``0..i-1`` saved, the caller's logits and the token ids; of block ``i`` itself only what
    its first norm saved (its input and statistics) and the gradients in flight: the qkv
    output's, the one the qkv projection is writing for its input, and the residual stream's;
    then that norm's own backward (``input_norm_backward``). In its post-backward only the
    gradient leaving the block is left of those. Earlier, with all it saved alive: its MLP's or
    experts' backward, its eager attention's, and the norms' between them with the MLP's
    gradients made. Inside a run of alike blocks every term is linear in ``i`` away from the
    run's ends, so the largest is at one of :meth:`FsdpBackward.candidates`: a run's first
    block (block 0 prefetches nothing; another's neighbour is unlike it), the one after it, the
    one before its last or its last (the last block finds no earlier reduce-scatter input).
    """
    t = batch.tokens
    res = FP32_BYTES if regime is Regime.AUTOCAST or regime is Regime.FP32 else HALF_BYTES
    lin = FP32_BYTES if regime is Regime.FP32 else HALF_BYTES
    stats = (1 if arch.norm is Norm.RMSNORM else 2) * FP32_BYTES * t
    qkv = arch.q_dim + 2 * arch.kv_dim
    leaving = res * t * arch.hidden  # the gradient of the block's input
    in_block = res * t * arch.hidden + stats + lin * t * (qkv + arch.hidden) + leaving
    # an eager attention's backward (or the memory-efficient kernel's), later in the block: the
    # MLP's saved tensors are freed
    core = attention_core_backward(arch, batch, regime.value)
    acc = accumulated_gradients
    # each moment of a block i: what the block adds with FSDP2's term, and whether the block's
    # own saved tensors are still alive (beside what the blocks below it keep)
    kinds: list[tuple[Callable[[int], int], bool]] = [
        # the end of its backward; its post-backward, its gradients copied in
        (lambda i: in_block + fsdp.at_block_end(i, acc), False),
        (lambda i: leaving + fsdp.at_reduce(i, acc), False),
    ]
    if any(b.cast_output for _, b in fsdp.blocks):
        kinds.append((lambda i: leaving + fsdp.at_cast(i, acc), False))
    if fsdp.prefetch:
        # before its backward: its saved tensors and the gradient entering it
        kinds.append((lambda i: leaving + fsdp.at_gather(i, acc), True))
        kinds.append((lambda i: leaving + fsdp.at_prefetch(i, acc), True))
    if arch.modelling is not None:
        # in its MLP's or experts' backward, its eager attention's, or the norms' between them
        # (with the MLP's gradients), block i - 1 prefetched, no gradient of the rest yet
        def within(i: int) -> int:
            before = fsdp.block(i).grads_before_attention
            attention = core + before if core else 0
            layer = inner(fsdp.grad_element_bytes, i)
            return leaving + max(attention, layer) + fsdp.at_block_start(i, acc)

        kinds.append((within, True))
        # its input norm's backward, every gradient of the block made
        end = input_norm_backward(arch, batch, regime.value)
        kinds.append((lambda i: end + fsdp.at_block_end(i, acc), False))
    base = acts.logits + acts.embedding
    moments = [
        base + acts.saved_below(i, arch.layers) + at(i) + (acts.saved(i, arch.layers) if own else 0)
        for i in fsdp.candidates()
        for at, own in kinds
    ]
    if acts.every_n_layers > 1:
        # with every_n_layers the blocks keep unlike amounts: every block is a candidate. Inside
        # a run of alike blocks FSDP2's terms are linear in the block, so each moment there is
        # what the blocks below keep plus a line through the run's second and third blocks
        for run in fsdp.inner_runs():
            for at, own in kinds:
                first = run.start - 1
                slope = at(first + 1) - at(first)
                line = at(first) - slope * first
                moments.append(base + line + acts.most_saved_below(run, slope, own))
    if fsdp.embedding_grads:
        # the token embedding's backward: the gradient leaving block 0 enters it
        moments.append(base + leaving + fsdp.at_embedding(acc))
    return max(moments)
