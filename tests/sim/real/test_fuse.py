"""sim.real.fuse: q/k/v and gate/up as one matmul each give the logits of
transformers' own modules, hold no weight twice, keep one compiled graph
per layer class, and leave alone what they cannot fuse."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from unikv.sim.real.fuse import fuse_projections  # noqa: E402

SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128)


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=2, **SMALL))


def gemma3():
    return transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        num_hidden_layers=2, sliding_window=6, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"], **SMALL))


def gpt_oss():  # q/k/v with biases; its MoE has no gate/up Linear pair
    return transformers.GptOssForCausalLM(transformers.GptOssConfig(
        num_hidden_layers=2, sliding_window=6, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"], **SMALL))


def _model(factory):
    torch.manual_seed(0)
    model = factory().float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def _storage_bytes(model) -> int:
    seen = {}
    for p in model.parameters():
        s = p.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


@pytest.mark.parametrize(("factory", "mlp"), [(llama, 2), (gemma3, 2), (gpt_oss, 0)])
def test_fused_model_gives_transformers_logits_and_holds_each_weight_once(factory, mlp, one_thread):
    model = _model(factory)
    fused = copy.deepcopy(model)
    before = _storage_bytes(fused)
    done = fuse_projections(fused)
    assert (done["attention"], done["mlp"], done["skipped"]) == (2, mlp, {})
    assert _storage_bytes(fused) == before  # the parts view the fused weight
    attn = fused.model.layers[0].self_attn
    assert type(attn).__name__ == "Fused" + type(model.model.layers[0].self_attn).__name__
    assert attn.q_proj.weight.data_ptr() == attn.unikv_fused_weight.data_ptr()
    ids = torch.randint(0, 96, (2, 11))
    with torch.inference_mode():
        want = model(input_ids=ids).logits
        got = fused(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert attn.unikv_group.input is None and attn.unikv_group.output is None  # nothing kept past the forward


def test_a_part_called_on_another_tensor_runs_its_own_rows(one_thread):
    model = _model(llama)
    attn = model.model.layers[0].self_attn
    q_weight = attn.q_proj.weight.detach().clone()
    fuse_projections(model)
    x = torch.randn(3, 64)
    group = attn.unikv_group
    group.input, group.output = torch.randn(3, 64), torch.zeros(3, 128)  # primed on another input
    torch.testing.assert_close(attn.q_proj(x), x @ q_weight.T)
    group.input = x
    assert torch.equal(attn.q_proj(x), torch.zeros(3, 64))  # on the primed input: its columns


def test_groups_that_cannot_be_fused_are_reported_and_left_alone(one_thread):
    model = _model(llama)
    mlp = model.model.layers[1].mlp
    mlp.up_proj = torch.nn.Linear(64, 96, bias=True)  # a bias where gate_proj has none
    fuse_projections(model)
    assert type(mlp).__name__ == "LlamaMLP" and type(mlp.up_proj) is torch.nn.Linear
    done = fuse_projections(model)  # a second pass: everything fused already, the odd MLP again refused
    assert done["attention"] == 0 and done["mlp"] == 0
    assert done["skipped"]["model.layers.1.mlp"] == "gate_proj/up_proj differ in input width, dtype, device or bias"
    assert done["skipped"]["model.layers.0.self_attn"] == "already fused"
    odd = _model(llama)
    odd.model.layers[0].self_attn.k_proj = torch.nn.Identity()
    assert fuse_projections(odd)["skipped"] == {
        "model.layers.0.self_attn": "q_proj/k_proj/v_proj are not all torch.nn.Linear"}


def test_fused_layers_of_a_class_share_one_compiled_graph(one_thread):
    from torch._dynamo.utils import counters

    model = _model(llama)
    want_layers = copy.deepcopy(model.model.layers)
    fuse_projections(model)
    compiled = torch.compile(type(model.model.layers[0]).forward, backend="aot_eager", fullgraph=True)
    x = torch.randn(1, 5, 64)
    pos = model.model.rotary_emb(x, torch.arange(5)[None])
    before = counters["stats"]["unique_graphs"]
    with torch.inference_mode():
        for layer, ref in zip(model.model.layers, want_layers):
            got = compiled(layer, x, position_embeddings=pos)
            want = ref(x, position_embeddings=pos)
            got, want = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] - before == 1
