"""LoRA adapters for the tests, made and saved by PEFT itself (a module of its own: conftest names
clash across test folders)."""

# name -> LoraConfig fields: different ranks (one not a power of two), target subsets, alpha, rsLoRA.
ADAPTERS = {
    "tone": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    "legal": dict(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                       "up_proj", "down_proj"]),
    "code": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["o_proj", "down_proj"]),
    "poet": dict(r=12, lora_alpha=24, target_modules=["k_proj", "gate_proj", "up_proj"]),
}


def make_adapter(hf_model, folder, seed: int, b_std: float = 0.02, **config):
    """A PEFT adapter saved by PEFT: its default A, and a random non-zero B (PEFT starts B at zero)."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    peft_model = get_peft_model(hf_model, LoraConfig(lora_dropout=0.0, **config))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, b_std)
    peft_model.save_pretrained(folder)
    peft_model.unload()  # the base model is shared
    return folder


def write_random_adapter(folder, shape, rank: int, targets: list[str], seed: int, b_std: float = 0.05):
    """A PEFT-format folder with random A and B for a base of `shape` (modelplex_multilora's BaseModelShape):
    for models PEFT cannot build here (the tiny GGUF files have no transformers twin)."""
    import json

    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(shape.num_layers):
        for module in targets:
            in_f, out_f = shape.modules[module]
            kind = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{kind}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_f, generator=g) / in_f ** 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_f, rank, generator=g) * b_std
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                            "target_modules": targets, "bias": "none"}))
    return folder
