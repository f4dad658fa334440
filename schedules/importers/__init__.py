"""Plan sections from the configs practitioners already have: Hugging Face ``config.json``,
DeepSpeed ``ds_config.json``, Megatron-LM arguments (or a launch script) and torchtitan TOML.

Each importer reads one file and returns the plan sections the file determines (plain dicts
with the plan's keys, as ``load_plan`` accepts them) and one warning line for every key it did
not carry over: not modelled, not understood, approximated, or left to the user (an HF Trainer
``"auto"``, a batch that depends on the world size). Nothing is dropped without a line. Bad
input (a wrong type, a missing required key, a combination the framework itself refuses) is a
one-line ``ValueError`` naming the file and the key. ``merge_sections`` lays the sections over a
base plan, later sources winning key by key.

One module per source: ``hf`` (``model_from_hf_config``), ``deepspeed``
(``from_deepspeed_config``), ``megatron`` (``from_megatron_args``, with ``shell`` reading launch
scripts into argument words) and ``torchtitan`` (``from_torchtitan_toml``); ``common`` holds
``Imported``, the typed readers that name the file and key, and ``merge_sections``. Each module's
docstring names the sources its mapping was read from.

    model = model_from_hf_config(Path("Meta-Llama-3-8B/config.json"))
    titan = from_torchtitan_toml(Path("llama3_8b.toml"))
    raw, warnings = merge_sections({"cluster": {"node": "dgx-h100"}}, model, titan)
"""

from schedules.importers.common import Imported, merge_sections
from schedules.importers.deepspeed import from_deepspeed_config
from schedules.importers.hf import model_from_hf_config
from schedules.importers.megatron import from_megatron_args
from schedules.importers.torchtitan import from_torchtitan_toml

__all__ = [
    "Imported",
    "from_deepspeed_config",
    "from_megatron_args",
    "from_torchtitan_toml",
    "merge_sections",
    "model_from_hf_config",
]
