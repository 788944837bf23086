"""Write the per-subject task files of the ``mmlu_local`` group (run from this folder).

``python _generate.py`` rewrites ``mmlu_local_<subject>.yaml`` and the group files.
"""

from __future__ import annotations

from pathlib import Path

import yaml

SUBJECTS = {
    "abstract_algebra": "stem", "anatomy": "stem", "astronomy": "stem",
    "business_ethics": "other", "clinical_knowledge": "other", "college_biology": "stem",
    "college_chemistry": "stem", "college_computer_science": "stem",
    "college_mathematics": "stem", "college_medicine": "other", "college_physics": "stem",
    "computer_security": "stem", "conceptual_physics": "stem", "econometrics": "social_sciences",
    "electrical_engineering": "stem", "elementary_mathematics": "stem",
    "formal_logic": "humanities", "global_facts": "other", "high_school_biology": "stem",
    "high_school_chemistry": "stem", "high_school_computer_science": "stem",
    "high_school_european_history": "humanities", "high_school_geography": "social_sciences",
    "high_school_government_and_politics": "social_sciences",
    "high_school_macroeconomics": "social_sciences", "high_school_mathematics": "stem",
    "high_school_microeconomics": "social_sciences", "high_school_physics": "stem",
    "high_school_psychology": "social_sciences", "high_school_statistics": "stem",
    "high_school_us_history": "humanities", "high_school_world_history": "humanities",
    "human_aging": "other", "human_sexuality": "social_sciences",
    "international_law": "humanities", "jurisprudence": "humanities",
    "logical_fallacies": "humanities", "machine_learning": "stem", "management": "other",
    "marketing": "other", "medical_genetics": "other", "miscellaneous": "other",
    "moral_disputes": "humanities", "moral_scenarios": "humanities", "nutrition": "other",
    "philosophy": "humanities", "prehistory": "humanities",
    "professional_accounting": "other", "professional_law": "humanities",
    "professional_medicine": "other", "professional_psychology": "social_sciences",
    "public_relations": "social_sciences", "security_studies": "social_sciences",
    "sociology": "social_sciences", "us_foreign_policy": "social_sciences",
    "virology": "other", "world_religions": "humanities",
}
CATEGORIES = ("stem", "other", "social_sciences", "humanities")
WEIGHTED_ACC = [{"metric": "acc", "weight_by_size": True}]


def _dump(path: Path, data: dict) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=100), encoding="utf-8")


def main(folder: Path | None = None) -> None:
    """Write the files into ``folder`` (default: the folder of this script)."""
    folder = Path(__file__).resolve().parent if folder is None else folder
    for subject, category in SUBJECTS.items():
        words = subject.replace("_", " ")
        _dump(folder / f"mmlu_local_{subject}.yaml", {
            "include": "_template_yaml",
            "task": f"mmlu_local_{subject}",
            "task_alias": words,
            "tag": f"mmlu_local_{category}_tasks",
            "dataset_kwargs": {"local_name": "mmlu", "subject": subject, "splits": ["dev", "test"]},
            "description": f"The following are multiple choice questions (with answers) about {words}.\n\n",
        })
    for category in CATEGORIES:
        _dump(folder / f"_mmlu_local_{category}.yaml", {
            "group": f"mmlu_local_{category}",
            "group_alias": category,
            "task": [f"mmlu_local_{category}_tasks"],
            "aggregate_metric_list": WEIGHTED_ACC,
            "metadata": {"version": 1},
        })
    _dump(folder / "_mmlu_local.yaml", {
        "group": "mmlu_local",
        "task": [f"mmlu_local_{c}" for c in CATEGORIES],
        "aggregate_metric_list": WEIGHTED_ACC,
        "metadata": {"version": 1},
    })


if __name__ == "__main__":
    main()
