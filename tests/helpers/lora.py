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
