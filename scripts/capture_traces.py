"""Capture allocation traces of workload families the shared traces lack.

Runs small models with random weights (nothing downloaded) on the CPU under
``torch.profiler`` with ``profile_memory=True``, exports each run as a chrome trace and
converts it to a cubepool trace v1 ``.jsonl.gz`` with ``cubepool convert``:

- ``llama-train``: a LLaMA-style decoder (RMSNorm, SwiGLU, rotary embeddings), AdamW,
  3 training steps;
- ``offload-infer``: inference that streams each layer's weights in before it runs
  and drops them after (layer-by-layer weight offload);
- ``bert-dynamic``: BERT-like encoder inference over batches of varying sequence length;
- ``calibrate-layers``: layer-wise calibration (each layer's activations collected,
  statistics computed, the layer's inputs replaced by its outputs), with
  ``gc.collect()`` between layers where a GPU run calls ``torch.cuda.empty_cache``
  (the CPU allocator has no cache to empty; a trace records no cleanup);
- ``kv-generate``: greedy generation with a growing KV cache (each new token's keys and
  values concatenated onto the cache), a small GPT-style decoder, several prompts of
  different lengths, each request a phase;
- ``moe-train``: mixture-of-experts training (top-2 token routing, so each expert gets a
  different number of tokens every step), AdamW, 3 steps;
- ``long-context-train``: LLaMA-style training at sequence length 2048 (small model), AdamW,
  3 steps;
- ``conv-dynamic``: inference of a small convolutional network on batches of images of
  varying size (dynamic shapes of another kind than sequence length);
- ``unet-diffusion``: training steps of a small diffusion UNet (convolutions down and up
  with skip connections, a timestep embedding, self-attention at the lowest
  resolution), AdamW, 3 steps;
- ``seq2seq-train``: training of an encoder-decoder transformer (``nn.Transformer``)
  on batches whose source and target lengths vary step to step, AdamW, 4 steps;
- ``resnet-train``: training of a small ResNet (convolutions, batch norm, residual
  connections, strided downsampling), SGD with momentum, 4 steps;
- ``gpt-accum-train``: GPT-style decoder training with gradient accumulation (2
  micro-batches per step, gradients summed before the optimizer step), AdamW, 4 steps;
- ``lstm-train``: an LSTM language model trained on batches whose sequence length
  varies step to step, Adam, 4 steps;
- ``bf16-train``: a transformer encoder trained under
  ``torch.autocast(device_type="cpu", dtype=torch.bfloat16)`` (float32 weights and
  optimizer state, bfloat16 activations and weight copies), AdamW, 4 steps;
- ``gnn-train``: a graph convolutional network trained on one random graph a step, of
  2,000-12,000 nodes (messages gathered along edges and summed into nodes), Adam, 4 steps;
- ``vae-train``: a convolutional variational autoencoder, Adam, 3 steps;
- ``dlrm-train``: a DLRM-style recommender (large embedding-bag tables, small MLPs,
  pairwise feature interactions), AdamW, 4 steps;
- ``spec-decode``: speculative decoding (a draft decoder proposes tokens, a target
  decoder checks them, both KV caches cut back to the accepted prefix);
- ``lora-finetune``: LoRA adapters trained on a frozen LLaMA-style model (gradients and
  optimizer state for the adapters only), AdamW, 4 steps;
- ``ckpt-train``: LLaMA-style training with activation checkpointing (each layer's
  activations dropped after its forward and recomputed in the backward), AdamW, 4 steps;
- ``beam-generate``: beam-search generation (4 beams a request, the KV caches reordered
  by the surviving beams every token), several prompts of different lengths;
- ``gan-train``: a DCGAN-style generator and discriminator, each with its own Adam,
  updated in turn, 4 steps;
- ``clip-train``: CLIP-style contrastive training of an image and a text tower (the
  batch-by-batch similarity matrix scored both ways), AdamW, 4 steps of two batch sizes;
- ``ssm-train``: a Mamba-style language model whose selective state-space recurrence
  runs a step per token (many small tensors a step), AdamW, 3 steps;
- ``speech-ctc-train``: a speech recognizer (convolutional subsampling of log-mels, a
  transformer encoder, CTC loss) on utterances of varying length, AdamW, 4 steps;
- ``diffusion-sample``: sampling from a diffusion UNet with classifier-free guidance
  (16 denoising steps a request, the batch doubled), 3 requests of different sizes.
- ``fsdp-train``: one rank of fully sharded data-parallel training (ZeRO-3 style) with
  activation checkpointing: each layer's flat parameters gathered into a new buffer for
  its forward and again for its recomputation, the full-size gradient cut back to the
  rank's shard, AdamW on the shards, 4 steps;
- ``serve-batching``: continuous batching of generation requests (each joins as another
  finishes, its prompt run alone, then one token an iteration for every request in the
  batch, each attending over its own KV cache grown by concatenation).
- ``pipeline-train``: a middle stage of pipeline-parallel training under the 1F1B
  schedule (several micro-batches' activations held at once, each freed by its
  backward while the next forward runs), AdamW, 3 steps.
- ``rl-finetune``: RL fine-tuning of a language model (PPO-style, as in RLHF):
  generation with a KV cache, a frozen reference's scoring and policy updates
  alternating in one process, 3 iterations;
- ``detect-train``: a two-stage detector (backbone, feature pyramid, a region head on
  bilinear samples of each image's proposals) on images whose size changes every step
  and whose number of proposals differs per image, SGD with momentum, 4 steps.
- ``foreach-train``: LLaMA-style training with the optimizer and the gradient clipping a
  GPU run uses by default: multi-tensor (``foreach=True``) AdamW and
  ``clip_grad_norm_``, whose steps make temporaries for every parameter at once (on the
  CPU PyTorch's default is one parameter at a time, which the other captures use), 4
  steps of varying length;
- ``video-train``: a 3D-convolutional video classifier (``Conv3d`` stages with batch norm,
  strided in time and space) on clips whose number of frames varies step to step, AdamW,
  4 steps;
- ``paged-serve``: serving with a paged KV cache (fixed-size blocks of 16 tokens, each
  its own tensor, allocated as a request's sequence grows, gathered by concatenation for
  every token's attention and freed when the request finishes) under continuous
  batching;
- ``pointcloud-train``: a PointNet++-style classifier with kNN grouping (``torch.cdist``,
  ``topk``, ``gather``) at two levels on clouds of 1,024-16,384 points varying step to
  step, AdamW, 4 steps;
- ``whisper-generate``: Whisper-style speech recognition: a transformer encoder over
  log-mel frames of varying length (300-1,500 after a strided convolutional stem), the
  decoder's cross-attention keys and values made once a request from its output, then
  greedy decoding with a self-attention KV cache grown by concatenation, each request a
  phase;
- ``navit-infer``: NaViT-style ViT inference on packed sequences (each batch the patch
  tokens of several images of different resolutions in one sequence, a block-diagonal
  attention mask keeping each image's tokens to themselves), batches of varying length;
- ``moe-offload-infer``: mixture-of-experts generation with expert offload (each expert's
  weights a flat buffer, as ``offload-infer`` keeps layers; a layer's forward copies in
  only the experts its tokens are routed to and drops them after), each prompt a phase.

The families with steps mark each step with a ``ProfilerStep#N`` span (a
``record_function`` of that name), which ``cubepool convert`` turns into the trace's
phases ``stepN``, so a planner can derive a plan on the first step.

torch is not a dependency of cubepool: run this with a Python that has torch (the CPU
build is enough) and cubepool's command line on ``PATH``::

    /path/to/torch-python scripts/capture_traces.py --out benches/traces

``--wider`` captures the families of ``WIDER`` again with every model width (dimension,
hidden size, channel count) doubled, into ``benches/traces/wider``: the same programs at
a larger scale, real captures where ``virtual_tradeoff.py --scaled-variants`` multiplies
a capture's sizes (weights grow as the square of a width, activations linearly, so the
mix of sizes changes as a real larger model's does). ``--width N`` multiplies the widths
by ``N`` instead (``--wider`` is ``--width 2``), into ``--out`` (no default folder: such
captures are checked, not kept; ``benches/traces/README.md`` has the figures of
``--width 4``).

Sizes are what PyTorch's CPU allocator was asked for.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.checkpoint import checkpoint


def step(number: int) -> record_function:
    """The span of step ``number``: ``cubepool convert`` makes it the phase ``step<number>``."""
    return record_function(f"ProfilerStep#{number}")


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, as LLaMA's."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * scale * self.weight


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embeddings over the last dimension of ``(b, h, t, d)``."""
    t, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.outer(torch.arange(t, dtype=torch.float32), inv)
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def split_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, ...]:
    """Queries, keys and values of ``qkv`` ``(b, t, 3 * d)``, each ``(b, heads, t, d / heads)``."""
    b, t, d3 = qkv.shape
    q, k, v = qkv.view(b, t, 3, heads, d3 // (3 * heads)).unbind(2)
    return tuple(y.transpose(1, 2) for y in (q, k, v))


class LlamaBlock(nn.Module):
    """One LLaMA decoder layer: RMSNorm, rotary attention, RMSNorm, SwiGLU."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = split_heads(self.qkv(self.norm1(x)), self.heads)
        q, k = rotary(q), rotary(k)
        attention = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attention.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """A small LLaMA-style language model."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(LlamaBlock(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def llama_train(width: int = 1) -> None:
    """AdamW training of a LLaMA-style model, 3 steps."""
    model = Llama(vocab=8192, dim=256 * width, layers=4, heads=4, hidden=688 * width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(3):
        tokens = torch.randint(0, 8192, (8, 128))
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def offload_infer(width: int = 1) -> None:
    """Inference whose layers' weights live 'offloaded' (as bytes) and are streamed in,
    layer by layer, before each runs, then dropped."""
    dim, hidden, layers = 512 * width, 1376 * width, 8
    offloaded = [LlamaBlock(dim, 8, hidden).state_dict() for _ in range(layers)]
    # The offloaded copies stand for host memory: keep them as one flat buffer each.
    flat = [torch.cat([p.flatten() for p in state.values()]).clone() for state in offloaded]
    del offloaded
    shell = LlamaBlock(dim, 8, hidden)
    shapes = [(name, p.shape) for name, p in shell.state_dict().items()]
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 256, dim)
            for buffer in flat:
                weights, start = {}, 0
                for name, shape in shapes:
                    count = math.prod(shape)
                    weights[name] = buffer[start : start + count].view(shape).clone()
                    start += count
                layer = LlamaBlock(dim, 8, hidden)
                layer.load_state_dict(weights, assign=True)
                x = layer(x)
                del layer, weights
            del x


def bert_dynamic(width: int = 1) -> None:
    """BERT-like encoder inference over batches of varying sequence lengths."""
    layer = nn.TransformerEncoderLayer(256 * width, 4, 1024 * width, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).eval()
    embed = nn.Embedding(8192, 256 * width)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(24):
            length = int(torch.randint(16, 384, (1,), generator=generator))
            batch = int(torch.randint(1, 17, (1,), generator=generator))
            tokens = torch.randint(0, 8192, (batch, length), generator=generator)
            encoder(embed(tokens)).mean().item()


def calibrate_layers(width: int = 1) -> None:
    """Layer-wise calibration: each layer runs on the calibration batches, its
    activations' statistics are collected, its outputs become the next layer's inputs,
    and garbage is collected between layers."""
    dim, hidden = 384 * width, 1024 * width
    layers = [LlamaBlock(dim, 6, hidden) for _ in range(6)]
    with torch.no_grad():
        inputs = [torch.randn(4, 192, dim) for _ in range(8)]
        for layer in layers:
            outputs, scales = [], []
            for x in inputs:
                y = layer(x)
                scales.append(y.abs().amax(dim=(0, 1)))
                outputs.append(y)
            torch.stack(scales).amax(0)
            inputs = outputs
            del outputs, scales
            gc.collect()


class DecoderLayer(nn.Module):
    """A GPT-style decoder layer's weights: LayerNorm, attention (qkv and out), LayerNorm,
    GELU MLP; its subclasses' ``forward`` runs them."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


Cache = tuple[torch.Tensor, torch.Tensor]
"""A layer's keys and values, ``(b, heads, t, d / heads)`` each."""


class CachedBlock(DecoderLayer):
    """A GPT-style decoder layer whose attention keeps a KV cache that grows by
    concatenation, one new token at a time."""

    def forward(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, t, d = x.shape
        q, k, v = split_heads(self.qkv(self.norm1(x)), self.heads)
        if cache is not None:
            k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
        # Causal within the prompt; a new token attends to the whole cache.
        attention = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        x = x + self.out(attention.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x)), (k, v)


def kv_generate(width: int = 1) -> None:
    """Greedy generation with a growing KV cache: 5 requests (batch 2) with prompts of
    different lengths, 48 new tokens each; each request is a phase."""
    vocab, dim, context = 8192, 256 * width, 512
    embed, positions = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
    blocks = [CachedBlock(dim, 4, 4 * dim) for _ in range(4)]
    norm, head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for number, prompt in enumerate((37, 211, 96, 350, 12)):
            with step(number):
                tokens = torch.randint(0, vocab, (2, prompt), generator=generator)
                caches: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(blocks)
                start = 0
                for _ in range(48):
                    t = tokens.shape[1]
                    x = embed(tokens) + positions(torch.arange(start, start + t))
                    for i, block in enumerate(blocks):
                        x, caches[i] = block(x, caches[i])
                    start += t
                    tokens = head(norm(x[:, -1:])).argmax(-1)
                del caches, tokens, x


class MoeBlock(nn.Module):
    """A decoder layer whose feed-forward is a mixture of experts with top-2 routing."""

    def __init__(self, dim: int, heads: int, hidden: int, experts: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, hidden), nn.SiLU(), nn.Linear(hidden, dim))
            for _ in range(experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = split_heads(self.qkv(self.norm1(x)), self.heads)
        attention = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attention.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x).reshape(b * t, d)
        weights, chosen = self.router(h).softmax(-1).topk(2, dim=-1)
        mixed = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel():
                routed = expert(h[token]) * weights[token, slot].unsqueeze(-1)
                mixed = mixed.index_add(0, token, routed)
        return x + mixed.view(b, t, d)


def moe_train(width: int = 1) -> None:
    """AdamW training of a mixture-of-experts decoder (8 experts, top-2), 3 steps."""
    vocab, dim = 8192, 256 * width
    embed = nn.Embedding(vocab, dim)
    blocks = nn.ModuleList(MoeBlock(dim, 4, 512 * width, 8) for _ in range(2))
    norm, head = RMSNorm(dim), nn.Linear(dim, vocab, bias=False)
    parameters = [p for m in (embed, blocks, norm, head) for p in m.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=1e-3)
    for number in range(3):
        with step(number):
            tokens = torch.randint(0, vocab, (8, 128))
            x = embed(tokens)
            for block in blocks:
                x = block(x)
            logits = head(norm(x))
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del x, logits, loss


def long_context_train(width: int = 1) -> None:
    """AdamW training of a small LLaMA-style model at sequence length 2048, 3 steps."""
    model = Llama(vocab=4096, dim=128 * width, layers=4, heads=4, hidden=344 * width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for number in range(3):
        with step(number):
            tokens = torch.randint(0, 4096, (2, 2048))
            logits = model(tokens)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del logits, loss


def conv_dynamic() -> None:
    """Inference of a small convolutional network on 16 batches of 1-8 images whose
    side varies from 64 to 255 pixels."""

    def stage(inputs: int, outputs: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(inputs, outputs, 3, padding=1),
            nn.BatchNorm2d(outputs),
            nn.ReLU(),
            nn.Conv2d(outputs, outputs, 3, padding=1),
            nn.BatchNorm2d(outputs),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )

    net = nn.Sequential(
        stage(3, 32),
        stage(32, 64),
        stage(64, 128),
        stage(128, 256),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(256, 1000),
    ).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(16):
            side = int(torch.randint(64, 256, (1,), generator=generator))
            batch = int(torch.randint(1, 9, (1,), generator=generator))
            net(torch.randn(batch, 3, side, side, generator=generator)).argmax(-1)


class UNetBlock(nn.Module):
    """Two convolutions with group norm and SiLU, the timestep embedding added between."""

    def __init__(self, inputs: int, outputs: int, embedding: int) -> None:
        super().__init__()
        self.first = nn.Conv2d(inputs, outputs, 3, padding=1)
        self.time = nn.Linear(embedding, outputs)
        self.second = nn.Conv2d(outputs, outputs, 3, padding=1)
        self.norms = nn.ModuleList([nn.GroupNorm(8, outputs), nn.GroupNorm(8, outputs)])
        self.skip = nn.Conv2d(inputs, outputs, 1) if inputs != outputs else nn.Identity()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = nn.functional.silu(self.norms[0](self.first(x)))
        h = h + self.time(t)[:, :, None, None]
        h = nn.functional.silu(self.norms[1](self.second(h)))
        return h + self.skip(x)


class UNet(nn.Module):
    """A small diffusion UNet: 3 resolutions down and up with skip connections, a
    sinusoidal timestep embedding, self-attention at the lowest resolution."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128), embedding: int = 128) -> None:
        super().__init__()
        self.embedding = embedding
        self.time = nn.Sequential(
            nn.Linear(embedding, embedding), nn.SiLU(), nn.Linear(embedding, embedding)
        )
        self.stem = nn.Conv2d(3, widths[0], 3, padding=1)
        self.down = nn.ModuleList(UNetBlock(a, b, embedding) for a, b in itertools.pairwise(widths))
        self.attention = nn.MultiheadAttention(widths[-1], 4, batch_first=True)
        self.up = nn.ModuleList(
            UNetBlock(2 * b, a, embedding)
            for a, b in zip(reversed(widths[:-1]), reversed(widths[1:]), strict=True)
        )
        self.out = nn.Conv2d(widths[0], 3, 3, padding=1)

    def forward(self, x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        half = self.embedding // 2
        frequencies = torch.exp(-math.log(10000.0) * torch.arange(half) / half)
        angles = steps[:, None].float() * frequencies[None]
        t = self.time(torch.cat([angles.sin(), angles.cos()], dim=-1))
        h = self.stem(x)
        skips = []
        for block in self.down:
            h = block(h, t)
            skips.append(h)
            h = nn.functional.avg_pool2d(h, 2)
        b, c, height, width = h.shape
        tokens = h.flatten(2).transpose(1, 2)
        tokens = tokens + self.attention(tokens, tokens, tokens, need_weights=False)[0]
        h = tokens.transpose(1, 2).reshape(b, c, height, width)
        for block in self.up:
            h = nn.functional.interpolate(h, scale_factor=2.0)
            h = block(torch.cat([h, skips.pop()], dim=1), t)
        return self.out(h)


def unet_diffusion() -> None:
    """AdamW training of a small diffusion UNet on noise prediction, 3 steps, batch 8 of
    64x64 images."""
    model = UNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for number in range(3):
        with step(number):
            images = torch.randn(8, 3, 64, 64)
            noise = torch.randn_like(images)
            steps = torch.randint(0, 1000, (8,))
            scale = (steps.float() / 1000.0)[:, None, None, None]
            noisy = (1 - scale).sqrt() * images + scale.sqrt() * noise
            loss = nn.functional.mse_loss(model(noisy, steps), noise)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del images, noise, noisy, loss


def seq2seq_train(width: int = 1) -> None:
    """AdamW training of an encoder-decoder transformer, 4 steps of batch 8 whose source
    (64-255 tokens) and target (32-159 tokens) lengths vary step to step."""
    vocab, dim = 8192, 256 * width
    embed = nn.Embedding(vocab, dim)
    model = nn.Transformer(
        dim,
        4,
        num_encoder_layers=3,
        num_decoder_layers=3,
        dim_feedforward=1024 * width,
        batch_first=True,
    )
    head = nn.Linear(dim, vocab, bias=False)
    parameters = [p for m in (embed, model, head) for p in m.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    for number in range(4):
        with step(number):
            source = int(torch.randint(64, 256, (1,), generator=generator))
            target = int(torch.randint(32, 160, (1,), generator=generator))
            src = torch.randint(0, vocab, (8, source), generator=generator)
            tgt = torch.randint(0, vocab, (8, target), generator=generator)
            mask = nn.Transformer.generate_square_subsequent_mask(target)
            logits = head(model(embed(src), embed(tgt), tgt_mask=mask))
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del logits, loss


class BasicBlock(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm, a residual connection
    (a strided 1x1 convolution when the shape changes)."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.first = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.second = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.norms = nn.ModuleList([nn.BatchNorm2d(outputs), nn.BatchNorm2d(outputs)])
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.skip = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.relu(self.norms[0](self.first(x)))
        return nn.functional.relu(self.norms[1](self.second(h)) + self.skip(x))


def resnet_train(width: int = 1) -> None:
    """SGD (momentum 0.9) training of a small ResNet (4 stages of 2 basic blocks, 32-256
    channels), 4 steps, batch 16 of 64x64 images, 100 classes."""
    widths = tuple(channels * width for channels in (32, 64, 128, 256))
    blocks: list[nn.Module] = []
    inputs = widths[0]
    for number, channels in enumerate(widths):
        stride = 1 if number == 0 else 2
        blocks += [BasicBlock(inputs, channels, stride), BasicBlock(channels, channels, 1)]
        inputs = channels
    model = nn.Sequential(
        nn.Conv2d(3, widths[0], 3, padding=1, bias=False),
        nn.BatchNorm2d(widths[0]),
        nn.ReLU(),
        *blocks,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(widths[-1], 100),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for number in range(4):
        with step(number):
            images = torch.randn(16, 3, 64, 64)
            labels = torch.randint(0, 100, (16,))
            loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del images, labels, loss


class GptBlock(DecoderLayer):
    """A GPT-style decoder layer: LayerNorm, causal attention, LayerNorm, GELU MLP."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = split_heads(self.qkv(self.norm1(x)), self.heads)
        attention = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attention.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


def gpt_accum_train(width: int = 1) -> None:
    """AdamW training of a GPT-style decoder (4 layers, d=256, vocab 8192) with gradient
    accumulation: 4 steps of 2 micro-batches of 4x256 tokens, the loss of each halved and
    its gradients summed before the optimizer step."""
    vocab, dim, context = 8192, 256 * width, 256
    embed, positions = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
    blocks = nn.ModuleList(GptBlock(dim, 4, 4 * dim) for _ in range(4))
    norm, head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
    parameters = [p for m in (embed, positions, blocks, norm, head) for p in m.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)
    micro_batches = 2
    for number in range(4):
        with step(number):
            for _ in range(micro_batches):
                tokens = torch.randint(0, vocab, (4, context))
                x = embed(tokens) + positions(torch.arange(context))
                for block in blocks:
                    x = block(x)
                logits = head(norm(x))
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
                (loss / micro_batches).backward()
                del tokens, x, logits, loss
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def lstm_train() -> None:
    """Adam training of an LSTM language model (2 layers, 512 hidden, vocab 8192), 4 steps
    of batch 16 whose sequence length (32-255 tokens) varies step to step."""
    vocab, dim = 8192, 512
    embed = nn.Embedding(vocab, dim)
    lstm = nn.LSTM(dim, dim, num_layers=2, batch_first=True)
    head = nn.Linear(dim, vocab)
    parameters = [p for m in (embed, lstm, head) for p in m.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    for number in range(4):
        with step(number):
            length = int(torch.randint(32, 256, (1,), generator=generator))
            tokens = torch.randint(0, vocab, (16, length + 1), generator=generator)
            hidden, _ = lstm(embed(tokens[:, :-1]))
            logits = head(hidden)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del tokens, hidden, logits, loss


def bf16_train(width: int = 1) -> None:
    """AdamW training of a transformer encoder (4 layers, d=256, vocab 8192) under
    ``torch.autocast(device_type="cpu", dtype=torch.bfloat16)``, 4 steps of batch 8 of
    192 tokens."""
    vocab, dim = 8192, 256 * width
    embed = nn.Embedding(vocab, dim)
    layer = nn.TransformerEncoderLayer(dim, 4, 1024 * width, batch_first=True, norm_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    head = nn.Linear(dim, vocab, bias=False)
    parameters = [p for m in (embed, encoder, head) for p in m.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)
    mask = nn.Transformer.generate_square_subsequent_mask(192)
    for number in range(4):
        with step(number):
            tokens = torch.randint(0, vocab, (8, 192))
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                logits = head(encoder(embed(tokens), mask=mask, is_causal=True))
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del tokens, logits, loss


def gnn_train() -> None:
    """Adam training of a 3-layer graph convolutional network on 4 random graphs of
    2,000-12,000 nodes and 8-16 edges a node (messages gathered along edges with
    ``index_select`` and summed into nodes with ``index_add``), one graph a step."""
    features, hidden, classes = 128, 256, 16
    layers = nn.ModuleList(
        nn.Linear(i, o) for i, o in ((features, hidden), (hidden, hidden), (hidden, classes))
    )
    optimizer = torch.optim.Adam(layers.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    for number in range(4):
        with step(number):
            nodes = int(torch.randint(2000, 12001, (1,), generator=generator))
            edges = nodes * int(torch.randint(8, 17, (1,), generator=generator))
            source = torch.randint(0, nodes, (edges,), generator=generator)
            target = torch.randint(0, nodes, (edges,), generator=generator)
            degree = torch.zeros(nodes).index_add(0, target, torch.ones(edges)).clamp(min=1)
            x = torch.randn(nodes, features, generator=generator)
            labels = torch.randint(0, classes, (nodes,), generator=generator)
            for i, layer in enumerate(layers):
                messages = layer(x).index_select(0, source)
                x = torch.zeros(nodes, messages.shape[1]).index_add(0, target, messages)
                x = x / degree.unsqueeze(1)
                if i < len(layers) - 1:
                    x = nn.functional.relu(x)
            loss = nn.functional.cross_entropy(x, labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del source, target, degree, x, labels, messages, loss


def vae_train() -> None:
    """Adam training of a convolutional variational autoencoder (4 strided convolutions
    down to a 128-dimensional latent, reparameterization, 4 transposed convolutions up),
    3 steps of batch 16 of 3x96x96 images."""
    channels = (3, 32, 64, 128, 256)
    down = list(itertools.pairwise(channels))
    encoder = nn.Sequential(
        *(layer for i, o in down for layer in (nn.Conv2d(i, o, 4, 2, 1), nn.ReLU())),
        nn.Flatten(),
    )
    to_latent = nn.Linear(256 * 6 * 6, 2 * 128)
    from_latent = nn.Linear(128, 256 * 6 * 6)
    up = [
        layer for o, i in reversed(down) for layer in (nn.ReLU(), nn.ConvTranspose2d(i, o, 4, 2, 1))
    ]
    decoder = nn.Sequential(*up[1:])
    modules = (encoder, to_latent, from_latent, decoder)
    optimizer = torch.optim.Adam([p for m in modules for p in m.parameters()], lr=1e-3)
    for number in range(3):
        with step(number):
            images = torch.rand(16, 3, 96, 96)
            mean, log_var = to_latent(encoder(images)).chunk(2, dim=1)
            z = mean + torch.randn_like(mean) * (0.5 * log_var).exp()
            rebuilt = decoder(from_latent(z).view(16, 256, 6, 6))
            kl = -0.5 * (1 + log_var - mean.pow(2) - log_var.exp()).sum(1).mean()
            loss = nn.functional.mse_loss(rebuilt, images) + 1e-3 * kl
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del images, mean, log_var, z, rebuilt, kl, loss


def dlrm_train() -> None:
    """AdamW training of a DLRM-style recommendation model: 8 embedding-bag tables of
    20,000-200,000 rows of 64 (bags of 1-20 ids), a bottom MLP over 13 dense features,
    the pairwise dot products of all 9 vectors and a top MLP; 4 steps of batch 1024."""
    generator = torch.Generator().manual_seed(0)
    rows = [20_000, 50_000, 200_000, 30_000, 100_000, 25_000, 60_000, 150_000]
    tables = nn.ModuleList(nn.EmbeddingBag(r, 64, mode="sum") for r in rows)
    bottom = nn.Sequential(nn.Linear(13, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU())
    top = nn.Sequential(
        nn.Linear(64 + 36, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1)
    )
    modules = (tables, bottom, top)
    optimizer = torch.optim.AdamW([p for m in modules for p in m.parameters()], lr=1e-3)
    batch = 1024
    upper = torch.triu_indices(9, 9, offset=1)
    for number in range(4):
        with step(number):
            dense = torch.randn(batch, 13, generator=generator)
            vectors = [bottom(dense)]
            for table, count in zip(tables, rows, strict=True):
                lengths = torch.randint(1, 21, (batch,), generator=generator)
                ids = torch.randint(0, count, (int(lengths.sum()),), generator=generator)
                offsets = torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]))
                vectors.append(table(ids, offsets))
            stacked = torch.stack(vectors, dim=1)
            pairs = torch.bmm(stacked, stacked.transpose(1, 2))[:, upper[0], upper[1]]
            logits = top(torch.cat((vectors[0], pairs), dim=1)).squeeze(1)
            clicks = torch.randint(0, 2, (batch,), generator=generator).float()
            loss = nn.functional.binary_cross_entropy_with_logits(logits, clicks)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del dense, vectors, stacked, pairs, logits, clicks, loss


def spec_decode(width: int = 1) -> None:
    """Speculative decoding: a 1-layer draft decoder proposes 4 tokens one at a time with
    its own KV cache, a 4-layer target decoder checks them in one pass over its KV cache,
    and both caches are cut back to the accepted prefix (sliced and copied); 3 requests of
    batch 1 with prompts of 40-300 tokens, 64 new tokens each, one phase per request."""
    vocab, dim, context = 8192, 256 * width, 512
    embed, positions = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
    head = nn.Linear(dim, vocab, bias=False)
    draft = [CachedBlock(dim, 4, 2 * dim)]
    target = [CachedBlock(dim, 4, 4 * dim) for _ in range(4)]
    generator = torch.Generator().manual_seed(0)

    def run(
        blocks: list[CachedBlock], caches: list[Cache | None], tokens: torch.Tensor, start: int
    ) -> torch.Tensor:
        """The logits of ``tokens`` at positions from ``start``; each block's cache grows."""
        x = embed(tokens) + positions(torch.arange(start, start + tokens.shape[1]))
        for i, block in enumerate(blocks):
            x, caches[i] = block(x, caches[i])
        return head(x)

    def cut(caches: list[Cache | None], length: int) -> list[Cache | None]:
        """Each cache cut back to its first ``length`` positions (copied)."""
        return [
            (k[:, :, :length].clone(), v[:, :, :length].clone()) for k, v in filter(None, caches)
        ]

    with torch.no_grad():
        for number, prompt in enumerate((40, 300, 150)):
            with step(number):
                tokens = torch.randint(0, vocab, (1, prompt), generator=generator)
                draft_caches: list[Cache | None] = [None]
                target_caches: list[Cache | None] = [None] * len(target)
                run(draft, draft_caches, tokens[:, :-1], 0)
                run(target, target_caches, tokens[:, :-1], 0)
                length, last, made = prompt - 1, tokens[:, -1:], 0
                while made < 64:
                    proposed, current = [], last
                    for k in range(4):
                        current = run(draft, draft_caches, current, length + k)[:, -1:].argmax(-1)
                        proposed.append(current)
                    guesses = torch.cat([last, *proposed], dim=1)
                    checked = run(target, target_caches, guesses, length).argmax(-1)
                    accepted = int(torch.randint(0, 5, (1,), generator=generator))
                    length += accepted + 1
                    made += accepted + 1
                    last = checked[:, accepted : accepted + 1]
                    draft_caches = cut(draft_caches, length)
                    target_caches = cut(target_caches, length)
                del tokens, draft_caches, target_caches, last


class LoraLinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (LoRA, rank 8)."""

    def __init__(self, inputs: int, outputs: int, rank: int = 8) -> None:
        super().__init__()
        self.base = nn.Linear(inputs, outputs, bias=False).requires_grad_(False)
        self.down = nn.Parameter(torch.randn(rank, inputs) * 0.01)
        self.up = nn.Parameter(torch.zeros(outputs, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.down.t()) @ self.up.t()


def lora_finetune(width: int = 1) -> None:
    """AdamW fine-tuning of LoRA adapters (rank 8) on every projection of a frozen
    LLaMA-style model (6 layers, d=384): no gradients or optimizer state for the base
    weights; 4 steps of batch 4 whose sequence length (64-383 tokens) varies by step."""
    model = Llama(
        vocab=8192, dim=384 * width, layers=6, heads=6, hidden=1024 * width
    ).requires_grad_(False)
    for block in model.blocks:
        for name in ("qkv", "out", "gate", "up", "down"):
            old = getattr(block, name)
            setattr(block, name, LoraLinear(old.in_features, old.out_features))
    adapters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(adapters, lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    for number in range(4):
        with step(number):
            length = int(torch.randint(64, 384, (1,), generator=generator))
            tokens = torch.randint(0, 8192, (4, length + 1), generator=generator)
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del tokens, logits, loss


def ckpt_train(width: int = 1) -> None:
    """AdamW training of a LLaMA-style model (6 layers, d=320) with activation
    checkpointing: each layer keeps only its input through the forward and recomputes
    its activations in the backward; 4 steps of batch 8 whose sequence length (96-255
    tokens) varies by step."""
    model = Llama(vocab=8192, dim=320 * width, layers=6, heads=5, hidden=864 * width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    for number in range(4):
        with step(number):
            length = int(torch.randint(96, 256, (1,), generator=generator))
            tokens = torch.randint(0, 8192, (8, length + 1), generator=generator)
            x = model.embed(tokens[:, :-1])
            for block in model.blocks:
                x = checkpoint(block, x, use_reentrant=False)
            logits = model.head(model.norm(x))
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del tokens, x, logits, loss


def beam_generate(width: int = 1) -> None:
    """Beam search with a KV cache: 3 requests (batch 2, 4 beams each) with prompts of
    different lengths, 40 new tokens each; after every token the caches are reordered
    (``index_select``) by the beams that survive. Each request is a phase."""
    vocab, dim, context, beams = 8192, 256 * width, 512, 4
    embed, positions = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
    blocks = [CachedBlock(dim, 4, 4 * dim) for _ in range(4)]
    norm, head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for number, prompt in enumerate((64, 230, 150)):
            with step(number):
                rows = 2 * beams
                prompt_tokens = torch.randint(0, vocab, (2, prompt), generator=generator)
                tokens = prompt_tokens.repeat_interleave(beams, dim=0)
                # Only the first copy of each prompt is live at first, so the beams part.
                scores = torch.full((2, beams), -math.inf)
                scores[:, 0] = 0.0
                caches: list[Cache | None] = [None] * len(blocks)
                start = 0
                for _ in range(40):
                    t = tokens.shape[1]
                    x = embed(tokens) + positions(torch.arange(start, start + t))
                    for i, block in enumerate(blocks):
                        x, caches[i] = block(x, caches[i])
                    start += t
                    logp = head(norm(x[:, -1])).log_softmax(-1).view(2, beams, vocab)
                    total = (scores.unsqueeze(-1) + logp).view(2, beams * vocab)
                    scores, best = total.topk(beams, dim=-1)
                    parents = (best // vocab + torch.arange(2).unsqueeze(1) * beams).view(rows)
                    caches = [
                        None
                        if cache is None
                        else (cache[0].index_select(0, parents), cache[1].index_select(0, parents))
                        for cache in caches
                    ]
                    tokens = (best % vocab).view(rows, 1)
                    del x, logp, total, best, parents
                del caches, tokens, scores, prompt_tokens


def gan_train() -> None:
    """DCGAN-style training: a generator (a 128-dimensional latent up through 4
    transposed convolutions to 3x64x64) and a discriminator (4 strided convolutions),
    each with its own Adam, updated in turn (discriminator on real and generated images,
    then generator), 4 steps of batch 32."""
    generator = nn.Sequential(
        nn.ConvTranspose2d(128, 256, 4, 1, 0),
        nn.BatchNorm2d(256),
        nn.ReLU(),
        *(
            layer
            for i, o in ((256, 128), (128, 64), (64, 32))
            for layer in (nn.ConvTranspose2d(i, o, 4, 2, 1), nn.BatchNorm2d(o), nn.ReLU())
        ),
        nn.ConvTranspose2d(32, 3, 4, 2, 1),
        nn.Tanh(),
    )
    discriminator = nn.Sequential(
        *(
            layer
            for i, o in ((3, 32), (32, 64), (64, 128), (128, 256))
            for layer in (nn.Conv2d(i, o, 4, 2, 1), nn.LeakyReLU(0.2))
        ),
        nn.Flatten(),
        nn.Linear(256 * 4 * 4, 1),
    )
    g_optimizer = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    d_optimizer = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    batch = 32
    ones, zeros = torch.ones(batch, 1), torch.zeros(batch, 1)
    for number in range(4):
        with step(number):
            real = torch.rand(batch, 3, 64, 64) * 2 - 1
            fake = generator(torch.randn(batch, 128, 1, 1))
            d_loss = nn.functional.binary_cross_entropy_with_logits(
                discriminator(real), ones
            ) + nn.functional.binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros)
            d_loss.backward()
            d_optimizer.step()
            d_optimizer.zero_grad(set_to_none=True)
            g_loss = nn.functional.binary_cross_entropy_with_logits(discriminator(fake), ones)
            g_loss.backward()
            g_optimizer.step()
            g_optimizer.zero_grad(set_to_none=True)
            discriminator.zero_grad(set_to_none=True)
            del real, fake, d_loss, g_loss


class TextTower(nn.Module):
    """A small transformer encoder over tokens, mean-pooled and projected."""

    def __init__(self, vocab: int, dim: int, out: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
        self.project = nn.Linear(dim, out)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.project(self.encoder(self.embed(tokens)).mean(1))


def clip_train() -> None:
    """CLIP-style contrastive training: an image tower (4 convolution stages, pooled) and
    a text tower (3-layer transformer, d=256, 32 tokens), both projected to 256 and
    normalized, the batch-by-batch similarity matrix scored both ways, AdamW, 4 steps of
    batch 64 and 96 in turn."""
    image_tower = nn.Sequential(
        *(
            layer
            for i, o in ((3, 32), (32, 64), (64, 128), (128, 256))
            for layer in (nn.Conv2d(i, o, 3, 2, 1), nn.BatchNorm2d(o), nn.GELU())
        ),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(256, 256),
    )
    text_tower = TextTower(8192, 256, 256)
    scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
    parameters = [*image_tower.parameters(), *text_tower.parameters(), scale]
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)
    for number, batch in enumerate((64, 96, 64, 96)):
        with step(number):
            images = torch.rand(batch, 3, 96, 96)
            tokens = torch.randint(0, 8192, (batch, 32))
            a = nn.functional.normalize(image_tower(images), dim=-1)
            b = nn.functional.normalize(text_tower(tokens), dim=-1)
            logits = scale.exp() * a @ b.t()
            labels = torch.arange(batch)
            loss = (
                nn.functional.cross_entropy(logits, labels)
                + nn.functional.cross_entropy(logits.t(), labels)
            ) / 2
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del images, tokens, a, b, logits, labels, loss


class SelectiveScan(nn.Module):
    """A Mamba-style block: input projection, causal depthwise convolution, a selective
    state-space recurrence run step by step over time (input-dependent step size and
    projections, a 16-wide state per channel), gated output projection."""

    def __init__(self, dim: int, state: int = 16) -> None:
        super().__init__()
        inner = 2 * dim
        self.norm = RMSNorm(dim)
        self.project_in = nn.Linear(dim, 2 * inner, bias=False)
        self.conv = nn.Conv1d(inner, inner, 4, padding=3, groups=inner)
        self.to_dt = nn.Linear(inner, inner)
        self.to_bc = nn.Linear(inner, 2 * state, bias=False)
        self.log_a = nn.Parameter(torch.log(torch.arange(1, state + 1).float()).repeat(inner, 1))
        self.project_out = nn.Linear(inner, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        u, gate = self.project_in(self.norm(x)).chunk(2, dim=-1)
        u = nn.functional.silu(self.conv(u.transpose(1, 2))[..., :t].transpose(1, 2))
        dt = nn.functional.softplus(self.to_dt(u))
        bb, cc = self.to_bc(u).chunk(2, dim=-1)
        a = -self.log_a.exp()
        h = torch.zeros(b, u.shape[-1], a.shape[-1])
        outputs = []
        for i in range(t):
            decay = torch.exp(dt[:, i, :, None] * a)
            h = decay * h + (dt[:, i, :, None] * bb[:, i, None, :]) * u[:, i, :, None]
            outputs.append((h * cc[:, i, None, :]).sum(-1))
        y = torch.stack(outputs, dim=1) * nn.functional.silu(gate)
        return x + self.project_out(y)


def ssm_train() -> None:
    """AdamW training of a Mamba-style language model (2 selective-scan blocks, d=128,
    vocab 4096) whose recurrence runs a step per token (many small tensors a step), 3
    steps of batch 4 of 48-96 tokens varying by step."""
    embed = nn.Embedding(4096, 128)
    blocks = nn.ModuleList(SelectiveScan(128) for _ in range(2))
    head = nn.Linear(128, 4096, bias=False)
    modules = (embed, blocks, head)
    optimizer = torch.optim.AdamW([p for m in modules for p in m.parameters()], lr=1e-3)
    for number, length in enumerate((64, 96, 48)):
        with step(number):
            tokens = torch.randint(0, 4096, (4, length + 1))
            x = embed(tokens[:, :-1])
            for block in blocks:
                x = block(x)
            loss = nn.functional.cross_entropy(head(x).flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del tokens, x, loss


def speech_ctc_train() -> None:
    """AdamW training of a speech recognizer: two strided convolutions subsampling an
    80-band log-mel spectrogram 4x in time, a 4-layer transformer encoder (d=256), CTC
    loss over a 64-symbol alphabet; 4 steps of batch 8 of utterances padded to 400-1,500
    frames (each step's lengths differ, each utterance its own length)."""
    frontend = nn.Sequential(
        nn.Conv2d(1, 64, 3, 2, 1), nn.ReLU(), nn.Conv2d(64, 64, 3, 2, 1), nn.ReLU()
    )
    to_model = nn.Linear(64 * 20, 256)
    layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, dropout=0.0)
    encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
    classify = nn.Linear(256, 64)
    modules = (frontend, to_model, encoder, classify)
    optimizer = torch.optim.AdamW([p for m in modules for p in m.parameters()], lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    ctc = nn.CTCLoss(zero_infinity=True)
    for number in range(4):
        with step(number):
            longest = int(torch.randint(400, 1501, (1,), generator=generator))
            lengths = torch.randint(longest // 2, longest + 1, (8,), generator=generator)
            lengths[0] = longest
            mel = torch.randn(8, 1, longest, 80, generator=generator)
            h = frontend(mel)
            b, c, t, f = h.shape
            h = to_model(h.permute(0, 2, 1, 3).reshape(b, t, c * f))
            padding = torch.arange(t)[None, :] >= ((lengths + 3) // 4)[:, None]
            logp = classify(encoder(h, src_key_padding_mask=padding)).log_softmax(-1)
            out_lengths = ((lengths + 3) // 4).clamp(max=t)
            target_lengths = (out_lengths // 4).clamp(min=1)
            targets = torch.randint(1, 64, (int(target_lengths.sum()),), generator=generator)
            loss = ctc(logp.transpose(0, 1), targets, out_lengths, target_lengths)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del mel, h, padding, logp, targets, loss


def diffusion_sample() -> None:
    """Sampling from a small diffusion UNet (the one ``unet_diffusion`` trains): 16
    DDIM-style denoising steps with classifier-free guidance (the batch doubled for the
    unconditional half, the two predictions mixed), 3 requests of 2, 4 and 6 images of
    64x64, one phase per request."""
    model = UNet().eval()
    with torch.no_grad():
        for number, batch in enumerate((2, 4, 6)):
            with step(number):
                x = torch.randn(batch, 3, 64, 64)
                for i in reversed(range(16)):
                    t = torch.full((2 * batch,), i * 62)
                    predicted = model(torch.cat([x, x]), t)
                    conditional, unconditional = predicted.chunk(2)
                    noise = unconditional + 3.0 * (conditional - unconditional)
                    alpha = 1.0 - (i + 1) / 17
                    x0 = (x - math.sqrt(1 - alpha) * noise) / math.sqrt(alpha)
                    previous = 1.0 - i / 17
                    x = math.sqrt(previous) * x0 + math.sqrt(1 - previous) * noise
                    del t, predicted, conditional, unconditional, noise, x0
                del x


def gathered(shard: torch.Tensor, ranks: int) -> torch.Tensor:
    """The full flat parameters of a layer whose ``shard`` this rank holds, as an
    all-gather leaves them: one new buffer of ``ranks`` shards (the other ranks' shards,
    which arrive over the network in a real run, are zeros that take no memory here)."""
    peers = torch.zeros(1).expand(shard.numel() * (ranks - 1))
    return torch.cat((shard, peers))


class FlatLlamaLayer:
    """A LLaMA decoder layer run from one flat buffer of its parameters (as a fully
    sharded data-parallel wrapper flattens them): the weights are views of it."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        self.heads = heads
        self.shapes = [
            (dim,),
            (3 * dim, dim),
            (dim, dim),
            (dim,),
            (hidden, dim),
            (hidden, dim),
            (dim, hidden),
        ]
        self.numel = sum(math.prod(shape) for shape in self.shapes)

    def __call__(self, x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        sizes = [math.prod(shape) for shape in self.shapes]
        parts = [
            p.view(s) for p, s in zip(flat[: self.numel].split(sizes), self.shapes, strict=True)
        ]
        norm1, qkv, out, norm2, gate, up, down = parts
        b, t, d = x.shape
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm1
        q, k, v = split_heads(nn.functional.linear(h, qkv), self.heads)
        attention = nn.functional.scaled_dot_product_attention(
            rotary(q), rotary(k), v, is_causal=True
        )
        x = x + nn.functional.linear(attention.transpose(1, 2).reshape(b, t, d), out)
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm2
        mlp = nn.functional.silu(nn.functional.linear(h, gate)) * nn.functional.linear(h, up)
        return x + nn.functional.linear(mlp, down)


def fsdp_train(width: int = 1) -> None:
    """One rank of fully sharded data-parallel training (ZeRO-3 style) with activation
    checkpointing: each of 6 LLaMA-style layers (d=384) keeps a quarter of its flat
    parameters (4 ranks); its forward gathers the full parameters into a new buffer,
    runs and drops them, and its backward gathers them again, recomputes, and the
    full-size gradient is cut back to the shard's. AdamW on the shards, 4 steps of batch
    4 of 96-255 tokens varying by step."""
    vocab, dim, ranks = 8192, 384 * width, 4
    embed = nn.Embedding(vocab, dim)
    head = nn.Linear(dim, vocab, bias=False)
    layers = [FlatLlamaLayer(dim, 6, 1024 * width) for _ in range(6)]
    shards = [nn.Parameter(torch.randn(-(-layer.numel // ranks)) * 0.02) for layer in layers]
    parameters = [*embed.parameters(), *head.parameters(), *shards]
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    for number, length in enumerate((128, 255, 96, 192)):
        with step(number):
            tokens = torch.randint(0, vocab, (4, length + 1), generator=generator)
            x = embed(tokens[:, :-1])
            for layer, shard in zip(layers, shards, strict=True):
                x = checkpoint(
                    lambda x, shard, layer=layer: layer(x, gathered(shard, ranks)),
                    x,
                    shard,
                    use_reentrant=False,
                )
            loss = nn.functional.cross_entropy(head(x).flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del tokens, x, loss


def attend_each(
    block: DecoderLayer, x: torch.Tensor, caches: list[Cache | None]
) -> tuple[torch.Tensor, list[Cache]]:
    """One decoder layer over ``x`` ``(n, 1, d)``, a new token of each of ``n`` requests:
    the projections and MLP batched, the attention of each request over its own cache
    (grown by the token's keys and values)."""
    n, _, d = x.shape
    q, k, v = split_heads(block.qkv(block.norm1(x)), block.heads)
    outputs, grown = [], []
    for i, cache in enumerate(caches):
        keys, values = k[i : i + 1], v[i : i + 1]
        if cache is not None:
            keys, values = torch.cat((cache[0], keys), dim=2), torch.cat((cache[1], values), dim=2)
        outputs.append(nn.functional.scaled_dot_product_attention(q[i : i + 1], keys, values))
        grown.append((keys, values))
    attention = torch.cat(outputs)
    x = x + block.out(attention.transpose(1, 2).reshape(n, 1, d))
    return x + block.mlp(block.norm2(x)), grown


def request_queue(
    count: int, shortest: int, longest: int, generator: torch.Generator
) -> list[tuple[int, int]]:
    """``count`` requests of a server, in arrival order: each its prompt's tokens (from
    ``shortest`` to ``longest``) and the new tokens it asks for (16-96)."""
    return [
        (int(prompt), int(new))
        for prompt, new in zip(
            torch.randint(shortest, longest + 1, (count,), generator=generator),
            torch.randint(16, 97, (count,), generator=generator),
            strict=True,
        )
    ]


def serve_batching(width: int = 1) -> None:
    """Continuous batching: 14 requests (prompts of 20-400 tokens, 16-96 new tokens
    each) served at most 5 at a time; a request joins as soon as one finishes, its prompt
    is run alone (its KV caches made), then every iteration decodes one token of every
    request in the batch, each attending over its own cache grown by concatenation;
    a finished request's caches are dropped. GPT-style decoder (4 layers, d=256,
    vocab 8192)."""
    vocab, dim, context = 8192, 256 * width, 512
    embed, positions = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
    blocks = [CachedBlock(dim, 4, 4 * dim) for _ in range(4)]
    norm, head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
    generator = torch.Generator().manual_seed(0)
    queue = request_queue(14, 20, 400, generator)
    # Each request in the batch: its caches (one per layer), next token, position and
    # the tokens it has still to make.
    batch: list[tuple[list[Cache], torch.Tensor, int, int]] = []
    with torch.no_grad():
        while queue or batch:
            while queue and len(batch) < 5:
                prompt, new = queue.pop(0)
                tokens = torch.randint(0, vocab, (1, prompt), generator=generator)
                x = embed(tokens) + positions(torch.arange(prompt))
                caches: list[Cache] = []
                for block in blocks:
                    x, cache = block(x, None)
                    caches.append(cache)
                batch.append((caches, head(norm(x[:, -1:])).argmax(-1), prompt, new))
                del tokens, x
            x = embed(torch.cat([token for _, token, _, _ in batch])) + positions(
                torch.tensor([[position] for _, _, position, _ in batch])
            )
            layer_caches = [[request[0][i] for request in batch] for i in range(len(blocks))]
            for i, block in enumerate(blocks):
                x, layer_caches[i] = attend_each(block, x, layer_caches[i])
            tokens = head(norm(x)).argmax(-1)
            batch = [
                (
                    [layer_caches[i][j] for i in range(len(blocks))],
                    tokens[j : j + 1],
                    position + 1,
                    new - 1,
                )
                for j, (_, _, position, new) in enumerate(batch)
                if new > 1
            ]
            del x, layer_caches, tokens


def pipeline_train(width: int = 1) -> None:
    """One middle stage of pipeline-parallel training under the 1F1B schedule: 4
    LLaMA-style layers (d=256); each step runs 8 micro-batches of 4 sequences, the first
    4 forwards ahead (their activations held), then one backward of the oldest in flight
    for every new forward, then the last backwards. A micro-batch's input arrives from
    the stage before (a new tensor) and its output's gradient from the stage after (one
    too). AdamW, 3 steps of 96-224 tokens varying by step."""
    dim, in_flight_most, micro_batches = 256 * width, 4, 8
    blocks = nn.ModuleList(LlamaBlock(dim, 4, 768 * width) for _ in range(4))
    optimizer = torch.optim.AdamW(blocks.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    for number, length in enumerate((160, 224, 96)):
        with step(number):
            in_flight: list[torch.Tensor] = []
            for micro_batch in range(micro_batches):
                x = torch.randn(4, length, dim, generator=generator, requires_grad=True)
                for block in blocks:
                    x = block(x)
                in_flight.append(x)
                if micro_batch >= in_flight_most - 1:
                    oldest = in_flight.pop(0)
                    oldest.backward(torch.randn(oldest.shape, generator=generator))
                    del oldest
                del x
            while in_flight:
                oldest = in_flight.pop(0)
                oldest.backward(torch.randn(oldest.shape, generator=generator))
                del oldest
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The log-probability of each of ``tokens`` ``(b, t)`` under ``logits`` ``(b, t, v)``."""
    return logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def rl_finetune(width: int = 1) -> None:
    """RL fine-tuning of a language model (PPO-style, as in RLHF): each iteration the
    policy generates completions for a batch of prompts with a KV cache (no gradients),
    a frozen reference copy scores the whole sequences, then the policy is trained on
    them (a clipped ratio of new to old log-probabilities times per-sequence advantages,
    a KL penalty to the reference), AdamW. Generation and training alternate in one
    process, so the memory of each phase lands among the other's long-lived tensors
    (weights, optimizer state, the rollouts). GPT-style decoder (4 layers, d=256, vocab
    8192), 3 iterations of 4 prompts of 24-120 tokens and 32-64 new tokens."""
    vocab, dim, context, layers = 8192, 256 * width, 256, 4
    embed, positions = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
    blocks = nn.ModuleList(CachedBlock(dim, 4, 4 * dim) for _ in range(layers))
    norm, head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
    policy = nn.ModuleList([embed, positions, blocks, norm, head])
    reference = {name: value.detach().clone() for name, value in policy.state_dict().items()}
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    generator = torch.Generator().manual_seed(0)

    def run(tokens: torch.Tensor) -> torch.Tensor:
        """The policy's logits over ``tokens``, causal, without a cache."""
        t = tokens.shape[1]
        x = embed(tokens) + positions(torch.arange(t))
        for block in blocks:
            x, _ = block(x, None)
        return head(norm(x))

    for number in range(3):
        with step(number):
            prompt = int(torch.randint(24, 121, (1,), generator=generator))
            new = int(torch.randint(32, 65, (1,), generator=generator))
            tokens = torch.randint(0, vocab, (4, prompt), generator=generator)
            # Rollout: generation with a KV cache grown by concatenation.
            with torch.no_grad():
                caches: list[Cache | None] = [None] * layers
                made, start, last = [tokens], 0, tokens
                for _ in range(new):
                    t = last.shape[1]
                    x = embed(last) + positions(torch.arange(start, start + t))
                    for i, block in enumerate(blocks):
                        x, caches[i] = block(x, caches[i])
                    start += t
                    last = head(norm(x[:, -1:])).argmax(-1)
                    made.append(last)
                del caches, x
                sequences = torch.cat(made, dim=1)
                del made, last
                old = log_probs(run(sequences[:, :-1]), sequences[:, 1:])
                # The reference model: the frozen weights swapped in for one pass.
                current = {
                    name: value.detach().clone() for name, value in policy.state_dict().items()
                }
                policy.load_state_dict(reference)
                ref = log_probs(run(sequences[:, :-1]), sequences[:, 1:])
                policy.load_state_dict(current)
                del current
                advantages = torch.randn(4, 1, generator=generator)
            # Two epochs of policy updates on the rollouts.
            for _ in range(2):
                new_lp = log_probs(run(sequences[:, :-1]), sequences[:, 1:])
                ratio = (new_lp - old).exp()
                clipped = ratio.clamp(0.8, 1.2)
                loss = -torch.minimum(ratio * advantages, clipped * advantages).mean()
                loss = loss + 0.1 * (new_lp - ref).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                del new_lp, ratio, clipped, loss
            del sequences, old, ref, advantages, tokens


class DetectionNet(nn.Module):
    """A small detector: a 4-stage convolutional backbone, a feature pyramid (lateral
    1x1 convolutions, upsampled and added top-down), a dense head on every level
    (objectness and box offsets), and a region head on features pooled from the finest
    level at each image's proposals (bilinear sampling, as RoI Align)."""

    def __init__(self, width: int = 1) -> None:
        super().__init__()
        channels = [32 * width, 64 * width, 128 * width, 256 * width]
        stages, previous = [], 3
        for c in channels:
            stages.append(
                nn.Sequential(
                    nn.Conv2d(previous, c, 3, stride=2, padding=1),
                    nn.BatchNorm2d(c),
                    nn.ReLU(),
                    nn.Conv2d(c, c, 3, padding=1),
                    nn.BatchNorm2d(c),
                    nn.ReLU(),
                )
            )
            previous = c
        self.stages = nn.ModuleList(stages)
        pyramid = 64 * width
        self.lateral = nn.ModuleList(nn.Conv2d(c, pyramid, 1) for c in channels)
        self.dense = nn.Conv2d(pyramid, 5, 3, padding=1)
        self.region = nn.Sequential(
            nn.Flatten(), nn.Linear(pyramid * 7 * 7, 256), nn.ReLU(), nn.Linear(256, 9)
        )

    def forward(
        self, images: torch.Tensor, boxes: list[torch.Tensor]
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        features, x = [], images
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        levels = [lateral(f) for lateral, f in zip(self.lateral, features, strict=True)]
        for i in range(len(levels) - 2, -1, -1):
            up = nn.functional.interpolate(levels[i + 1], size=levels[i].shape[-2:])
            levels[i] = levels[i] + up
        dense = [self.dense(level) for level in levels]
        # Each image's boxes (x0, y0, x1, y1 in [-1, 1]) as 7x7 sampling grids.
        pooled = []
        for image, image_boxes in enumerate(boxes):
            n = image_boxes.shape[0]
            steps = torch.linspace(0, 1, 7)
            xs = image_boxes[:, 0:1] + (image_boxes[:, 2:3] - image_boxes[:, 0:1]) * steps
            ys = image_boxes[:, 1:2] + (image_boxes[:, 3:4] - image_boxes[:, 1:2]) * steps
            grid = torch.stack(
                (xs.unsqueeze(1).expand(n, 7, 7), ys.unsqueeze(2).expand(n, 7, 7)), dim=-1
            )
            level = levels[0][image : image + 1].expand(n, -1, -1, -1)
            pooled.append(nn.functional.grid_sample(level, grid, align_corners=False))
        return dense, self.region(torch.cat(pooled))


def detect_train(width: int = 1) -> None:
    """SGD (momentum 0.9) training of a small two-stage detector on batches of 2 images
    whose size changes every step (160-320 pixels a side, not square) and whose number
    of proposals differs per image (8-96): dynamic shapes in two dimensions and a
    per-image number of regions, 4 steps."""
    model = DetectionNet(width)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    for number in range(4):
        with step(number):
            height = int(torch.randint(160, 321, (1,), generator=generator)) // 32 * 32
            width_px = int(torch.randint(160, 321, (1,), generator=generator)) // 32 * 32
            images = torch.randn(2, 3, height, width_px, generator=generator)
            boxes = []
            for _ in range(2):
                n = int(torch.randint(8, 97, (1,), generator=generator))
                corners = torch.rand(n, 2, generator=generator) * 1.4 - 1.0
                sizes = torch.rand(n, 2, generator=generator) * 0.5 + 0.1
                boxes.append(torch.cat((corners, corners + sizes), dim=1))
            dense, regions = model(images, boxes)
            loss = sum(d.pow(2).mean() for d in dense) + regions.pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del images, boxes, dense, regions, loss


def foreach_train(width: int = 1) -> None:
    """AdamW training of a LLaMA-style model (4 layers, d=256) with the multi-tensor
    (``foreach``) optimizer and gradient clipping, PyTorch's default on a GPU: each step's
    clipping and update run an operation over every parameter at once, so their
    temporaries (norms, the update's intermediate tensors) exist for all parameters
    together, where the per-parameter loop (the CPU's default) makes and drops them one
    parameter at a time. 4 steps of batch 8 of 96-192 tokens varying by step."""
    model = Llama(vocab=8192, dim=256 * width, layers=4, heads=4, hidden=688 * width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    generator = torch.Generator().manual_seed(0)
    for number, length in enumerate((128, 192, 96, 160)):
        with step(number):
            tokens = torch.randint(0, 8192, (8, length), generator=generator)
            logits = model(tokens)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del tokens, logits, loss


class VideoNet(nn.Module):
    """A small 3D-convolutional video classifier: a stem (space halved), then stages of
    two ``Conv3d`` with batch norm, the first strided in time and space, pooled to
    ``classes``."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128, 256), classes: int = 100) -> None:
        super().__init__()

        def conv(inputs: int, outputs: int, stride: int | tuple[int, ...]) -> list[nn.Module]:
            return [
                nn.Conv3d(inputs, outputs, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm3d(outputs),
                nn.ReLU(),
            ]

        layers = conv(3, widths[0], (1, 2, 2))
        for inputs, outputs in itertools.pairwise(widths):
            layers += conv(inputs, outputs, 2) + conv(outputs, outputs, 1)
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(clips).mean(dim=(2, 3, 4)))


def video_train() -> None:
    """AdamW training of a small 3D-convolutional video classifier (a stem and 3 stages
    of ``Conv3d`` with batch norm, 32-256 channels, each stage halving time and space), 4
    steps of batch 4 clips of 64x64 whose number of frames varies by step (8, 16, 12,
    4)."""
    model = VideoNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    for number, frames in enumerate((8, 16, 12, 4)):
        with step(number):
            clips = torch.randn(4, 3, frames, 64, 64, generator=generator)
            labels = torch.randint(0, 100, (4,), generator=generator)
            loss = nn.functional.cross_entropy(model(clips), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del clips, labels, loss


# The tokens of one block of a paged KV cache.
PAGE_TOKENS = 16


def store(pages: list[torch.Tensor], length: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Writes the keys and values ``(heads, t, d / heads)`` of ``t`` new tokens of a
    request at positions ``length`` on of its cache blocks ``pages`` (each ``(2, heads,
    PAGE_TOKENS, d / heads)``), a new block allocated whenever the last is full."""
    heads, t, size = keys.shape
    done = 0
    while done < t:
        at = (length + done) % PAGE_TOKENS
        if at == 0:
            pages.append(keys.new_empty(2, heads, PAGE_TOKENS, size))
        n = min(PAGE_TOKENS - at, t - done)
        pages[-1][0, :, at : at + n] = keys[:, done : done + n]
        pages[-1][1, :, at : at + n] = values[:, done : done + n]
        done += n


class PagedBlock(DecoderLayer):
    """A GPT-style decoder layer whose KV cache lives in fixed-size blocks of
    ``PAGE_TOKENS`` tokens (a list of block tensors per request, as a paged-attention
    server keeps it)."""

    def prefill(self, x: torch.Tensor, pages: list[torch.Tensor]) -> torch.Tensor:
        """A prompt ``(1, t, d)`` run alone, causally; its keys and values stored in new
        blocks ``pages``."""
        _, t, d = x.shape
        q, k, v = split_heads(self.qkv(self.norm1(x)), self.heads)
        store(pages, 0, k[0], v[0])
        attention = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attention.transpose(1, 2).reshape(1, t, d))
        return x + self.mlp(self.norm2(x))

    def decode(
        self, x: torch.Tensor, pages: list[list[torch.Tensor]], lengths: list[int]
    ) -> torch.Tensor:
        """One new token of each of ``n`` requests ``(n, 1, d)``: the projections and MLP
        batched; each token's keys and values stored in its request's blocks, which are
        gathered (concatenated) for its attention."""
        n, _, d = x.shape
        q, k, v = split_heads(self.qkv(self.norm1(x)), self.heads)
        outputs = []
        for i, (request, length) in enumerate(zip(pages, lengths, strict=True)):
            store(request, length, k[i], v[i])
            gathered = torch.cat(request, dim=2)[:, :, : length + 1]
            keys, values = gathered[0:1], gathered[1:2]
            outputs.append(nn.functional.scaled_dot_product_attention(q[i : i + 1], keys, values))
        attention = torch.cat(outputs)
        x = x + self.out(attention.transpose(1, 2).reshape(n, 1, d))
        return x + self.mlp(self.norm2(x))


def paged_serve() -> None:
    """Serving with a paged KV cache and continuous batching: 12 requests (prompts of
    16-320 tokens, 16-96 new tokens each) at most 5 at a time, a request joining as
    another finishes; its prompt run alone, then every iteration decodes one token of
    every running request. Each layer's cache of a request is a list of blocks of 16
    tokens' keys and values, a block allocated when the sequence needs one and all freed
    when the request finishes; attention gathers a request's blocks (``torch.cat``)
    every token. GPT-style decoder (4 layers, d=256, vocab 8192); a phase starts as each
    group of 4 requests begins to be admitted."""
    vocab, dim, context = 8192, 256, 512
    embed, positions = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
    blocks = [PagedBlock(dim, 4, 4 * dim) for _ in range(4)]
    norm, head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
    generator = torch.Generator().manual_seed(0)
    queue = request_queue(12, 16, 320, generator)
    # Each running request: its blocks (a list per layer), next token, length and the
    # tokens it has still to make.
    running: list[tuple[list[list[torch.Tensor]], torch.Tensor, int, int]] = []
    admitted = 0
    with torch.no_grad():
        while queue or running:
            while queue and len(running) < 5:
                with step(admitted // 4):
                    prompt, new = queue.pop(0)
                    admitted += 1
                    x = embed(torch.randint(0, vocab, (1, prompt), generator=generator))
                    x = x + positions(torch.arange(prompt))
                    pages: list[list[torch.Tensor]] = [[] for _ in blocks]
                    for block, layer_pages in zip(blocks, pages, strict=True):
                        x = block.prefill(x, layer_pages)
                    running.append((pages, head(norm(x[:, -1:])).argmax(-1), prompt, new))
                    del x
            lengths = [length for _, _, length, _ in running]
            x = embed(torch.cat([token for _, token, _, _ in running]))
            x = x + positions(torch.tensor([[length] for length in lengths]))
            for i, block in enumerate(blocks):
                x = block.decode(x, [request[0][i] for request in running], lengths)
            tokens = head(norm(x)).argmax(-1)
            running = [
                (pages, tokens[j : j + 1], length + 1, new - 1)
                for j, (pages, _, length, new) in enumerate(running)
                if new > 1
            ]
            del x, tokens


def knn_group(
    points: torch.Tensor, features: torch.Tensor, centers: torch.Tensor, k: int
) -> torch.Tensor:
    """The ``k`` nearest of ``points`` ``(b, n, 3)`` to each of ``centers`` ``(b, m, 3)``
    (``torch.cdist`` and ``topk``), their offsets from the center and their ``features``
    ``(b, n, c)`` gathered: ``(b, m, k, 3 + c)``."""
    b, m, _ = centers.shape
    nearest = torch.cdist(centers, points).topk(k, dim=-1, largest=False).indices
    index = nearest.reshape(b, m * k, 1)
    offsets = torch.gather(points, 1, index.expand(-1, -1, 3)).view(b, m, k, 3)
    gathered = torch.gather(features, 1, index.expand(-1, -1, features.shape[-1]))
    return torch.cat((offsets - centers[:, :, None], gathered.view(b, m, k, -1)), dim=-1)


class SetAbstraction(nn.Module):
    """A PointNet++ set abstraction: one point in ``ratio`` kept as a center, its ``k``
    nearest neighbours grouped, a shared MLP over each and a max over the group."""

    def __init__(self, inputs: int, outputs: int, ratio: int, k: int) -> None:
        super().__init__()
        self.ratio, self.k = ratio, k
        self.mlp = nn.Sequential(
            nn.Linear(inputs + 3, outputs),
            nn.LayerNorm(outputs),
            nn.ReLU(),
            nn.Linear(outputs, outputs),
            nn.ReLU(),
        )

    def forward(
        self, points: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        kept = torch.randperm(points.shape[1])[: points.shape[1] // self.ratio]
        centers = points[:, kept]
        grouped = knn_group(points, features, centers, self.k)
        return centers, self.mlp(grouped).amax(dim=2)


def pointcloud_train() -> None:
    """AdamW training of a PointNet++-style classifier (a per-point MLP, two set
    abstractions with kNN grouping: 1 point in 16 kept with its 32 nearest, then 1 in 4
    with its 16 nearest; a global max and an MLP head to 40 classes), 4 steps of batch 2
    clouds whose number of points varies step to step (2,048, 16,384, 1,024, 8,192)."""
    model = nn.ModuleDict(
        {
            "embed": nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU()),
            "first": SetAbstraction(64, 128, 16, 32),
            "second": SetAbstraction(128, 256, 4, 16),
            "head": nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 40)),
        }
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    for number, count in enumerate((2048, 16384, 1024, 8192)):
        with step(number):
            points = torch.rand(2, count, 3, generator=generator)
            labels = torch.randint(0, 40, (2,), generator=generator)
            centers, features = model["first"](points, model["embed"](points))
            _, features = model["second"](centers, features)
            logits = model["head"](features.amax(dim=1))
            loss = nn.functional.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del points, labels, centers, features, logits, loss


class EncoderBlock(DecoderLayer):
    """A pre-norm transformer encoder layer: LayerNorm, attention over the whole sequence
    (restricted by ``mask`` where one is given), LayerNorm, GELU MLP."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = split_heads(self.qkv(self.norm1(x)), self.heads)
        attention = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.out(attention.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class CrossBlock(DecoderLayer):
    """A Whisper-style decoder layer: self-attention over a KV cache grown by
    concatenation, cross-attention over keys and values of the encoder's output (made
    once per request by ``encoded``), a GELU MLP."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__(dim, heads, hidden)
        self.norm_cross = nn.LayerNorm(dim)
        self.query, self.cross_out = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.cross_kv = nn.Linear(dim, 2 * dim)

    def encoded(self, audio: torch.Tensor) -> Cache:
        """The cross-attention's keys and values of the encoder's output ``audio``."""
        b, s, d = audio.shape
        k, v = self.cross_kv(audio).view(b, s, 2, self.heads, d // self.heads).unbind(2)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(
        self, x: torch.Tensor, cache: Cache | None, cross: Cache
    ) -> tuple[torch.Tensor, Cache]:
        b, t, d = x.shape
        q, k, v = split_heads(self.qkv(self.norm1(x)), self.heads)
        if cache is not None:
            k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
        attention = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        x = x + self.out(attention.transpose(1, 2).reshape(b, t, d))
        q = self.query(self.norm_cross(x)).view(b, t, self.heads, d // self.heads).transpose(1, 2)
        attention = nn.functional.scaled_dot_product_attention(q, *cross)
        x = x + self.cross_out(attention.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x)), (k, v)


def whisper_generate() -> None:
    """Whisper-style speech recognition, 6 requests (batch 1) each a phase: an 80-band
    log-mel spectrogram of 600-3,000 frames through a convolutional stem (the second
    convolution strided, so 300-1,500 frames), a 4-layer transformer encoder (d=256),
    the 4 decoder layers' cross-attention keys and values made once from its output,
    then greedy decoding of 20-60 tokens after 4 start tokens, the self-attention KV
    caches grown by concatenation (vocab 8192, the output tied to the embedding)."""
    vocab, dim, layers = 8192, 256, 4
    stem = nn.Sequential(
        nn.Conv1d(80, dim, 3, padding=1),
        nn.GELU(),
        nn.Conv1d(dim, dim, 3, stride=2, padding=1),
        nn.GELU(),
    )
    audio_positions = nn.Embedding(1500, dim)
    encoder = [EncoderBlock(dim, 4, 4 * dim) for _ in range(layers)]
    decoder = [CrossBlock(dim, 4, 4 * dim) for _ in range(layers)]
    embed, positions = nn.Embedding(vocab, dim), nn.Embedding(448, dim)
    audio_norm, norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for number in range(6):
            with step(number):
                frames = int(torch.randint(300, 1501, (1,), generator=generator))
                new = int(torch.randint(20, 61, (1,), generator=generator))
                mel = torch.randn(1, 80, 2 * frames, generator=generator)
                audio = stem(mel).transpose(1, 2) + audio_positions.weight[:frames]
                for block in encoder:
                    audio = block(audio)
                audio = audio_norm(audio)
                crosses = [block.encoded(audio) for block in decoder]
                del mel, audio
                tokens = torch.randint(0, vocab, (1, 4), generator=generator)
                caches: list[Cache | None] = [None] * layers
                start = 0
                for _ in range(new):
                    t = tokens.shape[1]
                    x = embed(tokens) + positions(torch.arange(start, start + t))
                    for i, block in enumerate(decoder):
                        x, caches[i] = block(x, caches[i], crosses[i])
                    start += t
                    tokens = (norm(x[:, -1:]) @ embed.weight.T).argmax(-1)
                del crosses, caches, tokens, x


def navit_infer() -> None:
    """NaViT-style ViT inference on packed sequences: 14 batches of 2-10 images each of
    its own resolution (64-320 pixels a side, height and width drawn apart, patches of
    16), every batch's patch tokens packed into one sequence without padding (232-1,641
    tokens) with factorized row and column position embeddings, a 6-layer encoder
    (d=256) whose attention a block-diagonal mask keeps within each image, each image's
    tokens mean-pooled to a 1000-class head."""
    dim, patch, sides = 256, 16, 20
    embed = nn.Linear(3 * patch * patch, dim)
    rows, columns = nn.Embedding(sides, dim), nn.Embedding(sides, dim)
    blocks = [EncoderBlock(dim, 4, 4 * dim) for _ in range(6)]
    norm, head = nn.LayerNorm(dim), nn.Linear(dim, 1000)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(14):
            count = int(torch.randint(2, 11, (1,), generator=generator))
            shapes = torch.randint(4, sides + 1, (count, 2), generator=generator).tolist()
            patches, places = [], []
            for h, w in shapes:
                image = torch.randn(3, h * patch, w * patch, generator=generator)
                grid = image.view(3, h, patch, w, patch).permute(1, 3, 0, 2, 4)
                patches.append(grid.reshape(h * w, 3 * patch * patch))
                places.append(torch.cartesian_prod(torch.arange(h), torch.arange(w)))
                del image, grid
            place = torch.cat(places)
            x = embed(torch.cat(patches)) + rows(place[:, 0]) + columns(place[:, 1])
            sizes = torch.tensor([h * w for h, w in shapes])
            image_of = torch.repeat_interleave(torch.arange(count), sizes)
            mask = image_of[:, None] == image_of[None, :]
            del patches, places, place
            x = x.unsqueeze(0)
            for block in blocks:
                x = block(x, mask)
            pooled = torch.zeros(count, dim).index_add(0, image_of, norm(x[0]))
            head(pooled / sizes[:, None]).argmax(-1)
            del x, mask, image_of, pooled


class OffloadedMoeBlock(nn.Module):
    """A decoder layer (RMSNorm, attention over a KV cache grown by concatenation,
    RMSNorm, a mixture of SwiGLU experts with top-2 routing) whose experts live
    'offloaded': each expert's weights are one flat buffer (host memory), and a forward
    copies in the weights of only the experts its tokens are routed to, dropping them
    after."""

    def __init__(self, dim: int, heads: int, hidden: int, experts: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.router = nn.Linear(dim, experts, bias=False)
        # Each expert's gate, up and down projections, one flat buffer an expert.
        self.shapes = ((hidden, dim), (hidden, dim), (dim, hidden))
        numel = sum(math.prod(shape) for shape in self.shapes)
        self.offloaded = [torch.randn(numel).mul_(dim**-0.5) for _ in range(experts)]

    def load(self, expert: int) -> list[torch.Tensor]:
        """Expert ``expert``'s weights, copied in from its offloaded buffer."""
        buffer, start, weights = self.offloaded[expert], 0, []
        for shape in self.shapes:
            count = math.prod(shape)
            weights.append(buffer[start : start + count].view(shape).clone())
            start += count
        return weights

    def forward(self, x: torch.Tensor, cache: Cache | None) -> tuple[torch.Tensor, Cache]:
        b, t, d = x.shape
        q, k, v = split_heads(self.qkv(self.norm1(x)), self.heads)
        if cache is not None:
            k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
        attention = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        x = x + self.out(attention.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x).reshape(b * t, d)
        weights, chosen = self.router(h).softmax(-1).topk(2, dim=-1)
        loaded = {int(e): self.load(int(e)) for e in chosen.unique()}
        mixed = torch.zeros_like(h)
        for e, (gate, up, down) in loaded.items():
            token, slot = (chosen == e).nonzero(as_tuple=True)
            routed = h[token]
            hidden = nn.functional.silu(routed @ gate.T) * (routed @ up.T)
            mixed = mixed.index_add(0, token, (hidden @ down.T) * weights[token, slot, None])
        del loaded
        return x + mixed.view(b, t, d), (k, v)


def moe_offload_infer() -> None:
    """Mixture-of-experts decoder inference with expert offload: 4 layers (d=256), each
    of 8 SwiGLU experts (hidden 1024, top-2 routing) kept as one flat buffer; every
    layer's forward copies in the weights of the experts its tokens are routed to and
    drops them after (a prompt's tokens reach all 8, a new token 2). 4 prompts (batch 1) of
    32-256 tokens, each run whole, then 32 new tokens one at a time with KV caches grown
    by concatenation (vocab 8192); each prompt is a phase."""
    vocab, dim, layers = 8192, 256, 4
    embed, positions = nn.Embedding(vocab, dim), nn.Embedding(512, dim)
    blocks = [OffloadedMoeBlock(dim, 4, 1024, 8) for _ in range(layers)]
    norm, head = RMSNorm(dim), nn.Linear(dim, vocab, bias=False)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for number in range(4):
            with step(number):
                prompt = int(torch.randint(32, 257, (1,), generator=generator))
                tokens = torch.randint(0, vocab, (1, prompt), generator=generator)
                caches: list[Cache | None] = [None] * layers
                start = 0
                for _ in range(32):
                    t = tokens.shape[1]
                    x = embed(tokens) + positions(torch.arange(start, start + t))
                    for i, block in enumerate(blocks):
                        x, caches[i] = block(x, caches[i])
                    start += t
                    tokens = head(norm(x[:, -1:])).argmax(-1)
                del caches, tokens, x


FAMILIES: dict[str, tuple[Callable[..., None], str]] = {
    "llama-train": (
        llama_train,
        "LLaMA-style decoder (RMSNorm, SwiGLU, rotary; 4 layers, d=256, vocab 8192), "
        "AdamW, 3 steps, batch 8, seq 128",
    ),
    "offload-infer": (
        offload_infer,
        "inference streaming each of 8 LLaMA-style layers' weights (d=512) in before it "
        "runs and dropping them after, 3 passes, batch 4, seq 256",
    ),
    "bert-dynamic": (
        bert_dynamic,
        "BERT-like encoder (4 layers, d=256) inference, 24 batches of 1-16 sequences of "
        "16-383 tokens",
    ),
    "calibrate-layers": (
        calibrate_layers,
        "layer-wise calibration of 6 LLaMA-style layers (d=384) on 8 batches of 4x192, "
        "outputs replacing inputs layer by layer, gc.collect() between layers",
    ),
    "kv-generate": (
        kv_generate,
        "greedy generation with a KV cache grown by concatenation, GPT-style decoder "
        "(4 layers, d=256, vocab 8192), 5 requests of batch 2, prompts of 12-350 tokens, "
        "48 new tokens each, one phase per request",
    ),
    "moe-train": (
        moe_train,
        "mixture-of-experts decoder (2 layers, d=256, 8 experts, top-2 routing), AdamW, "
        "3 steps, batch 8, seq 128, one phase per step",
    ),
    "long-context-train": (
        long_context_train,
        "LLaMA-style decoder (4 layers, d=128, vocab 4096), AdamW, 3 steps, batch 2, "
        "seq 2048, one phase per step",
    ),
    "conv-dynamic": (
        conv_dynamic,
        "convolutional network (8 conv layers, 32-256 channels) inference, 16 batches of "
        "1-8 images of 64-255 pixels a side",
    ),
    "unet-diffusion": (
        unet_diffusion,
        "diffusion UNet (3 resolutions, 32-128 channels, skip connections, timestep "
        "embedding, self-attention at 16x16), AdamW, 3 steps, batch 8 of 64x64, one phase "
        "per step",
    ),
    "seq2seq-train": (
        seq2seq_train,
        "encoder-decoder transformer (nn.Transformer, 3+3 layers, d=256, vocab 8192), "
        "AdamW, 4 steps of batch 8, source 64-255 and target 32-159 tokens varying by "
        "step, one phase per step",
    ),
    "resnet-train": (
        resnet_train,
        "ResNet (4 stages of 2 basic blocks, 32-256 channels, batch norm, residual "
        "connections), SGD with momentum, 4 steps of batch 16 of 64x64, one phase per step",
    ),
    "gpt-accum-train": (
        gpt_accum_train,
        "GPT-style decoder (4 layers, d=256, vocab 8192), AdamW, 4 steps of 2 accumulated "
        "micro-batches of 4x256 tokens, one phase per step",
    ),
    "lstm-train": (
        lstm_train,
        "LSTM language model (2 layers, 512 hidden, vocab 8192), Adam, 4 steps of batch 16 "
        "of 32-255 tokens varying by step, one phase per step",
    ),
    "bf16-train": (
        bf16_train,
        "transformer encoder (4 layers, d=256, vocab 8192, causal) under CPU bfloat16 "
        "autocast, AdamW, 4 steps of batch 8 of 192 tokens, one phase per step",
    ),
    "gnn-train": (
        gnn_train,
        "graph convolutional network (3 layers, 128-256 features), Adam, 4 steps of one "
        "random graph of 2,000-12,000 nodes and 8-16 edges a node, one phase per step",
    ),
    "vae-train": (
        vae_train,
        "convolutional VAE (4 strided convolutions down, 128-dimensional latent, 4 "
        "transposed convolutions up), Adam, 3 steps of batch 16 of 96x96, one phase per step",
    ),
    "dlrm-train": (
        dlrm_train,
        "DLRM-style recommender (8 embedding bags of 20,000-200,000 rows of 64, bottom and "
        "top MLPs, pairwise interactions), AdamW, 4 steps of batch 1024, one phase per step",
    ),
    "spec-decode": (
        spec_decode,
        "speculative decoding (1-layer draft, 4-layer target, d=256, 4 tokens proposed a "
        "round, both KV caches cut back to the accepted prefix), 3 requests of prompts of "
        "40-300 tokens, 64 new tokens each, one phase per request",
    ),
    "lora-finetune": (
        lora_finetune,
        "LoRA adapters (rank 8) on a frozen LLaMA-style model (6 layers, d=384), AdamW, 4 "
        "steps of batch 4 of 64-383 tokens varying by step, one phase per step",
    ),
    "ckpt-train": (
        ckpt_train,
        "LLaMA-style decoder (6 layers, d=320, vocab 8192) with activation checkpointing "
        "per layer, AdamW, 4 steps of batch 8 of 96-255 tokens varying by step, one phase "
        "per step",
    ),
    "beam-generate": (
        beam_generate,
        "beam search (4 beams) with KV caches reordered by the surviving beams every "
        "token, GPT-style decoder (4 layers, d=256, vocab 8192), 3 requests of batch 2, "
        "prompts of 64-230 tokens, 40 new tokens each, one phase per request",
    ),
    "gan-train": (
        gan_train,
        "DCGAN-style generator (latent 128, 4 transposed convolutions to 3x64x64) and "
        "discriminator (4 strided convolutions), each its own Adam, updated in turn, 4 steps "
        "of batch 32, one phase per step",
    ),
    "clip-train": (
        clip_train,
        "CLIP-style contrastive training (convolutional image tower, 3-layer text "
        "transformer, d=256, batch-by-batch similarity scored both ways), AdamW, 4 steps "
        "of batch 64 and 96 in turn, one phase per step",
    ),
    "ssm-train": (
        ssm_train,
        "Mamba-style language model (2 selective-scan blocks, d=128, the recurrence a "
        "step per token), AdamW, 3 steps of batch 4 of 48-96 tokens, one phase per step",
    ),
    "speech-ctc-train": (
        speech_ctc_train,
        "speech recognizer (2 strided convolutions over 80-band log-mels, 4-layer "
        "transformer encoder, d=256, CTC loss), AdamW, 4 steps of batch 8 of 400-1,500 "
        "frames, one phase per step",
    ),
    "diffusion-sample": (
        diffusion_sample,
        "sampling from a diffusion UNet (16 denoising steps, classifier-free guidance "
        "doubling the batch), 3 requests of 2, 4 and 6 images of 64x64, one phase per "
        "request",
    ),
    "fsdp-train": (
        fsdp_train,
        "one rank of fully sharded data-parallel training (4 ranks) with activation "
        "checkpointing: 6 LLaMA-style layers (d=384) whose flat parameters are gathered "
        "into a new buffer for each forward and recomputation, AdamW on the shards, 4 "
        "steps of batch 4 of 96-255 tokens, one phase per step",
    ),
    "serve-batching": (
        serve_batching,
        "continuous batching: 14 requests (prompts of 20-400 tokens, 16-96 new) at most 5 "
        "at a time, each joining as another finishes, decoded together with a KV cache of "
        "its own grown by concatenation, GPT-style decoder (4 layers, d=256, vocab 8192)",
    ),
    "pipeline-train": (
        pipeline_train,
        "a middle stage of pipeline-parallel training under the 1F1B schedule: 4 "
        "LLaMA-style layers (d=256), 8 micro-batches of 4 sequences a step, at most 4 in "
        "flight, AdamW, 3 steps of 96-224 tokens, one phase per step",
    ),
    "rl-finetune": (
        rl_finetune,
        "RL fine-tuning (PPO-style): each iteration 4 prompts of 24-120 tokens generate "
        "32-64 new tokens with a KV cache, a frozen reference scores them, then 2 policy "
        "updates (clipped ratio, KL penalty), AdamW; GPT-style decoder (4 layers, d=256, "
        "vocab 8192), 3 iterations, one phase per iteration",
    ),
    "detect-train": (
        detect_train,
        "two-stage detector (4-stage convolutional backbone, feature pyramid, dense head, "
        "region head on 7x7 bilinear samples of each image's 8-96 proposals), SGD with "
        "momentum, 4 steps of 2 images of 160-320 pixels a side varying by step, one "
        "phase per step",
    ),
    "foreach-train": (
        foreach_train,
        "LLaMA-style decoder (4 layers, d=256, vocab 8192) with multi-tensor (foreach) "
        "AdamW and gradient clipping, a GPU run's defaults, 4 steps of batch 8 of 96-192 "
        "tokens varying by step, one phase per step",
    ),
    "video-train": (
        video_train,
        "3D-convolutional video classifier (a stem and 3 stages of Conv3d with batch norm, "
        "32-256 channels, strided in time and space), AdamW, 4 steps of batch 4 clips of "
        "64x64 of 8, 16, 12 and 4 frames, one phase per step",
    ),
    "paged-serve": (
        paged_serve,
        "serving with a paged KV cache (blocks of 16 tokens, each its own tensor, allocated "
        "as a sequence grows and freed when its request finishes, gathered by torch.cat "
        "every token): 12 requests (prompts of 16-320 tokens, 16-96 new) at most 5 at a "
        "time, continuous batching, GPT-style decoder (4 layers, d=256, vocab 8192), a "
        "phase per 4 requests admitted",
    ),
    "pointcloud-train": (
        pointcloud_train,
        "PointNet++-style classifier (per-point MLP, 2 set abstractions with kNN grouping "
        "by cdist, topk and gather), AdamW, 4 steps of batch 2 clouds of 1,024-16,384 "
        "points varying by step, one phase per step",
    ),
    "whisper-generate": (
        whisper_generate,
        "Whisper-style speech recognition (strided convolutional stem, 4-layer encoder and "
        "4-layer decoder, d=256, cross-attention keys and values made once a request), 6 "
        "requests of 300-1,500 frames, greedy decoding of 20-60 tokens with a KV cache "
        "grown by concatenation, one phase per request",
    ),
    "navit-infer": (
        navit_infer,
        "NaViT-style ViT (6 layers, d=256, patches of 16) inference on packed sequences: "
        "14 batches of 2-10 images of 64-320 pixels a side, each batch one sequence of "
        "232-1,641 tokens with a block-diagonal attention mask per image",
    ),
    "moe-offload-infer": (
        moe_offload_infer,
        "mixture-of-experts decoder (4 layers, d=256, 8 SwiGLU experts of hidden 1024, "
        "top-2) whose experts are offloaded as flat buffers and copied in only when routed "
        "to, dropped after each layer; 4 prompts of 32-256 tokens, 32 new tokens each with "
        "a KV cache, one phase per prompt",
    ),
}


# The families whose model widths ``--wider`` multiplies (each takes ``width``): those
# with a model dimension but lstm-train (already 512 wide), the image, graph and
# recommender families conv-dynamic, unet-diffusion, vae-train, gnn-train and dlrm-train,
# whose sizes follow their inputs more than a width, and gan-train to diffusion-sample,
# written without a width. detect-train, an image family too, takes a width (its channel
# counts). video-train, paged-serve, pointcloud-train, whisper-generate, navit-infer and
# moe-offload-infer, captured later, take none.
WIDER = (
    "llama-train",
    "offload-infer",
    "bert-dynamic",
    "calibrate-layers",
    "kv-generate",
    "moe-train",
    "long-context-train",
    "seq2seq-train",
    "resnet-train",
    "gpt-accum-train",
    "bf16-train",
    "spec-decode",
    "lora-finetune",
    "ckpt-train",
    "beam-generate",
    "fsdp-train",
    "serve-batching",
    "pipeline-train",
    "rl-finetune",
    "detect-train",
    "foreach-train",
)
# What ``--wider`` multiplies the widths by.
WIDTH_FACTOR = 2


def capture(name: str, out: Path, width: int = 1) -> Path:
    """Runs family ``name`` under the profiler (its model widths times ``width``) and
    converts it into ``out``."""
    run, _ = FAMILIES[name]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        chrome = Path(folder) / f"{name}.json"
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            if width == 1:
                run()
            else:
                run(width)
        profiler.export_chrome_trace(str(chrome))
        target = out / f"{name}.jsonl.gz"
        subprocess.run(["cubepool", "convert", str(chrome), str(target)], check=True)
    return target


def main() -> None:
    """Captures the families named (all by default) into ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, help="default: benches/traces, or benches/traces/wider with --wider"
    )
    parser.add_argument(
        "--wider",
        action="store_true",
        help=f"the families of WIDER with their model widths x{WIDTH_FACTOR}",
    )
    parser.add_argument(
        "--width",
        type=int,
        metavar="N",
        help="the families of WIDER with their model widths xN (2 or more; needs --out)",
    )
    parser.add_argument("names", nargs="*", help=f"of {', '.join(FAMILIES)} (default: all)")
    args = parser.parse_args()
    if args.width is not None and (args.width < 2 or args.wider or args.out is None):
        parser.error("--width takes a factor of 2 or more, with --out and without --wider")
    width = WIDTH_FACTOR if args.wider else args.width or 1
    offered = WIDER if width > 1 else tuple(FAMILIES)
    unknown = [name for name in args.names if name not in offered]
    if unknown:
        parser.error(f"unknown families {unknown}: expected some of {list(offered)}")
    out = args.out or Path("benches/traces/wider" if args.wider else "benches/traces")
    torch.set_num_threads(2)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.names or offered:
        note = f" (widths x{width})" if width > 1 else ""
        print(capture(name, out, width), FAMILIES[name][1] + note)


if __name__ == "__main__":
    main()
