"""One module per family: its FamilySpec (`FAMILY`) and its presets (`PRESETS`).

Adding a family is adding a module here and its name to `FAMILY_MODULES`.
"""
import importlib

FAMILY_MODULES = ["bert", "roberta", "albert", "distil_bert", "electra", "spanbert", "xlnet",
                 "longformer"]


def load_all():
    """-> ({family: FamilySpec}, {preset name: Preset})"""
    families, presets = {}, {}
    for module_name in FAMILY_MODULES:
        module = importlib.import_module(f"{__name__}.{module_name}")
        families[module.FAMILY.name] = module.FAMILY
        for preset in module.PRESETS:
            if preset.name in presets:
                raise ValueError(f"Preset {preset.name!r} is registered twice.")
            presets[preset.name] = preset
    return families, presets
