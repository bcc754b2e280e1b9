#!/usr/bin/env python3
"""Seeded generator: 200 synthetic NeuroVLM-Bench rows.

Writes
  /tmp/nvb_eval/rows.jsonl                         neutral form (truth + raw model response text)
  /tmp/nvb_eval/chatmed/results/synthetic_200.jsonl  evaluator input, exactly the record layout written by
                                                   run_async.py (parsed_response = utils.parse_json_response(raw))
  /tmp/nvb_eval/row_notes.json                     per-row note of which edge case (if any) the row exercises

Truth conventions follow the repo's subset CSVs read with csv.reader: unknown truth = "" (empty string),
never null.  Truth subclass spellings are the benchmark's own (neurocitoma, papiloma, meduloblastoma,
"pituitary tumor"); predictions use the prompt's answer spellings (neurocytoma, papilloma, medulloblastoma,
pituitary_tumor).
"""
import json
import os
import random
import sys

sys.path.insert(0, "/tmp/nvb_eval/repo")
from utils import parse_json_response  # their parser, unchanged

SEED = 20260325
rng = random.Random(SEED)
MODEL = "openai/gpt-4o"  # must be a key of MODEL_PRICES in evaluate_detailed.py (else KeyError)
OUT_DIR = "/tmp/nvb_eval"
EVAL_IN_DIR = os.path.join(OUT_DIR, "chatmed", "results")

# ------------------------------------------------------------------ truth
TRUTH_SUB_TO_PRED = {  # benchmark truth spelling -> model-answer spelling
    "glioma": "glioma", "meningioma": "meningioma", "neurocitoma": "neurocytoma",
    "schwannoma": "schwannoma", "pituitary tumor": "pituitary_tumor", "carcinoma": "carcinoma",
    "papiloma": "papilloma", "tuberculoma": "tuberculoma", "meduloblastoma": "medulloblastoma",
    "germinoma": "germinoma", "granuloma": "granuloma", "ischemic": "ischemic", "hemorrhagic": "hemorrhagic",
}
TUMOR_PRED_SUBS = ["glioma", "meningioma", "pituitary_tumor", "carcinoma", "germinoma", "granuloma",
                   "medulloblastoma", "neurocytoma", "papilloma", "schwannoma", "tuberculoma"]
CLASSES = ["tumor", "stroke", "multiple sclerosis", "normal", "other abnormalities"]

truth_rows = []


def add(n, dataset, cls, sub, modality, subtypes, planes, path_fn):
    for k in range(n):
        truth_rows.append({
            "dataset": dataset,
            "file_path": path_fn(k),
            "truth": {
                "class": cls,
                "subclass": sub,
                "modality": modality,
                "modality_subtype": subtypes[k % len(subtypes)],
                "plane": planes[k % len(planes)],
            },
        })


# sclerosis (MRI FLAIR, axial/sagittal)
add(20, "sclerosis", "multiple sclerosis", "", "MRI", ["FLAIR"], ["axial", "sagittal"],
    lambda k: f"sclerosis/MS/MS {'Axial' if k % 2 == 0 else 'Saggital'}_crop/{'A' if k % 2 == 0 else 'S'}1 ({100 + 7 * k}).png")
add(14, "sclerosis", "normal", "", "MRI", ["FLAIR"], ["sagittal", "axial"],
    lambda k: f"sclerosis/MS/Control {'Saggital' if k % 2 == 0 else 'Axial'}_crop/kontrol {20 + k} ({k % 9 + 1}).png")
# stroke CT (no sequence), axial
add(14, "stroke", "stroke", "ischemic", "CT", [""], ["axial"],
    lambda k: f"stroke/Brain_Stroke_CT_Dataset/Ischemia/PNG/{11000 + 37 * k}.png")
add(14, "stroke", "stroke", "hemorrhagic", "CT", [""], ["axial"],
    lambda k: f"stroke/Brain_Stroke_CT_Dataset/Bleeding/PNG/{10000 + 41 * k}.png")
add(12, "stroke", "normal", "", "CT", [""], ["axial"],
    lambda k: f"stroke/Brain_Stroke_CT_Dataset/Normal/PNG/{12700 + 53 * k}.png")
add(10, "aisd", "stroke", "ischemic", "CT", [""], ["axial"],
    lambda k: f"aisd/image/0{226143 + 1111 * k}/0{10 + k}.png")
# images-17 (MRI T1/T1C+/T2, axial) -- folder names contain spaces, commas, parentheses
I17 = {
    "glioma": "Glioma (Astrocitoma, Ganglioglioma, Glioblastoma, Oligodendroglioma, Ependimoma)",
    "meningioma": "Meningioma (de Baixo Grau, Atípico, Anaplásico, Transicional)",
    "neurocitoma": "Neurocitoma (Central - Intraventricular, Extraventricular)",
    "schwannoma": "Schwannoma (Acustico, Vestibular - Trigeminal)",
}
for sub, n in [("glioma", 6), ("meningioma", 6), ("neurocitoma", 5), ("schwannoma", 5)]:
    add(n, "images-17", "tumor", sub, "MRI", ["T1", "T1C+", "T2"], ["axial"],
        lambda k, sub=sub: f"images-17/{I17[sub]} {['T1', 'T1C+', 'T2'][k % 3]}/{sub} ({30 + 11 * k}).jpeg")
add(22, "images-17", "other abnormalities", "", "MRI", ["T1", "T1C+", "T2"], ["axial"],
    lambda k: f"images-17/Outros Tipos de Lesões (Abscessos, Cistos, Encefalopatias Diversas) {['T1', 'T1C+', 'T2'][k % 3]}/outros ({5 + 4 * k}).jpeg")
add(6, "images-17", "normal", "", "MRI", ["T1", "T2"], ["axial"],
    lambda k: f"images-17/_NORMAL {['T1', 'T2'][k % 2]}/normal ({60 + k}).jpeg")
# images-44c (MRI T1/T1C+/T2, plane unknown "")
I44 = {"carcinoma": "Carcinoma", "papiloma": "Papiloma", "tuberculoma": "Tuberculoma",
       "meduloblastoma": "Meduloblastoma", "germinoma": "Germinoma", "granuloma": "Granuloma",
       "glioma": "Glioblastoma", "meningioma": "Meningioma", "schwannoma": "Schwannoma",
       "neurocitoma": "Neurocitoma"}
for sub, n in [("carcinoma", 4), ("papiloma", 4), ("tuberculoma", 3), ("meduloblastoma", 3), ("germinoma", 3),
               ("granuloma", 3), ("glioma", 3), ("meningioma", 2), ("schwannoma", 2), ("neurocitoma", 2)]:
    add(n, "images-44c", "tumor", sub, "MRI", ["T1C+", "T1", "T2"], [""],
        lambda k, sub=sub: f"images-44c/{I44[sub]} {['T1C+', 'T1', 'T2'][k % 3]}/2022-06-{10 + k} 14_09_5{k}-Window (copy, {k}).jpg")
add(4, "images-44c", "normal", "", "MRI", ["T1", "T2"], [""],
    lambda k: f"images-44c/_NORMAL {['T1', 'T2'][k % 2]}/Tr-no_{1000 + k} (1).jpg")
# figshare (MRI T1C+, axial/sagittal)
for sub, n in [("glioma", 5), ("meningioma", 5), ("pituitary tumor", 6)]:
    add(n, "figshare", "tumor", sub, "MRI", ["T1C+"], ["axial", "sagittal"],
        lambda k, sub=sub: f"figshare/{sub.replace(' ', '_')}/{2000 + 13 * k}.png")
# Br35H (MRI, sequence unknown, axial; tumour without subtype)
add(9, "Br35H", "tumor", "", "MRI", [""], ["axial"], lambda k: f"Br35H/yes/y{800 + 9 * k}.jpg")
add(8, "Br35H", "normal", "", "MRI", [""], ["axial"], lambda k: f"Br35H/no/no {k + 1}.jpg")

assert len(truth_rows) == 200, len(truth_rows)
rng.shuffle(truth_rows)

# ------------------------------------------------------------------ edge-case assignment
N = len(truth_rows)
idx = list(range(N))
rng.shuffle(idx)
pool = iter(idx)


def take(n):
    return [next(pool) for _ in range(n)]


# abstentions of diagnosis_name (all become "undetermined" in their normaliser)
AB_NULL = take(3)            # "diagnosis_name": null
AB_MISSING = take(3)         # key absent
AB_UNDET = take(2)           # "undetermined"
AB_UNDET_CAPS = take(1)      # " Undetermined "
AB_NULLSTR = take(1)         # "null" (string)
AB_EMPTY = take(1)           # ""
AB_GARBAGE = take(1)         # prose, no braces -> parse error dict
AB_TRUNC = take(1)           # truncated JSON (no closing brace) -> parse error dict
AB_TWOOBJ = take(1)          # two JSON objects -> first '{'..last '}' fails json.loads -> parse error dict
AB_PYDICT = take(1)          # single-quoted python dict -> parse error dict
AB_NONE = take(1)            # response content None -> parse_json_response(None) -> 'Unexpected error' dict
ABSTAIN = set(AB_NULL + AB_MISSING + AB_UNDET + AB_UNDET_CAPS + AB_NULLSTR + AB_EMPTY + AB_GARBAGE + AB_TRUNC
              + AB_TWOOBJ + AB_PYDICT + AB_NONE)
WHOLE_PARSE_FAIL = set(AB_GARBAGE + AB_TRUNC + AB_TWOOBJ + AB_PYDICT + AB_NONE)

# "None" string: NOT mapped to undetermined by normalize_class_label (-> label 'none'),
# but counted in their 'uncertainty' percentage.
NONE_STR = take(1)

# class-spelling variants (non-abstaining)
VAR_CLASS = take(6)
# wrong class predictions
WRONG_CLASS = take(18)
# confidence oddities
CONF_MISSING = take(6)
CONF_NULL = take(3)
CONF_STR_NUM = take(1)   # "0.85"
CONF_STR_TXT = take(1)   # "high"
CONF_OVER1 = take(1)     # 85 -> clipped to 1.0
EDGE_VALUES = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
# Remaining rows are drawn from a separate shuffled list so edges overlap freely with other cases.
edge_idx = list(range(N))
rng.shuffle(edge_idx)
CONF_EDGE = {}
skip = set(CONF_MISSING + CONF_NULL + CONF_STR_NUM + CONF_STR_TXT + CONF_OVER1)
j = 0
for v in EDGE_VALUES:
    for _ in range(2):
        while edge_idx[j] in skip:
            j += 1
        CONF_EDGE[edge_idx[j]] = v
        j += 1

notes = {}


def note(i, s):
    notes.setdefault(i, []).append(s)


# ------------------------------------------------------------------ build predictions
def pred_subclass(true_cls, true_sub, pred_cls, class_correct):
    """Return (value, note) for diagnosis_detailed; value None means JSON null."""
    if pred_cls not in ("tumor", "stroke"):
        return None, None
    if class_correct and true_sub:
        r = rng.random()
        if r < 0.70:
            return TRUTH_SUB_TO_PRED[true_sub], None
        if r < 0.85:  # wrong subtype of the right family
            fam = TUMOR_PRED_SUBS if pred_cls == "tumor" else ["ischemic", "hemorrhagic"]
            choices = [s for s in fam if s != TRUTH_SUB_TO_PRED[true_sub]]
            return rng.choice(choices), "wrong_subclass"
        if r < 0.92:
            return None, "subclass_null_class_right"
        # spelling variants that their normaliser maps
        variants = {
            "glioma": ["glioblastoma", "Astrocytoma (pilocytic)", "ependymoma"],
            "ischemic": ["ischemic stroke", "Ischemic"],
            "hemorrhagic": ["hemorrhagic stroke", "Hemorrhagic"],  # 'hemorrhagic stroke' is NOT mapped
            "carcinoma": ["metastasis", "Carcinoma"],
            "pituitary tumor": ["pituitary adenoma", "Pituitary_Tumor"],
            "neurocitoma": ["central neurocytoma", "Neurocytoma"],
            "meduloblastoma": ["Medulloblastoma"],
            "papiloma": ["choroid plexus papilloma", "Papilloma"],
        }
        v = rng.choice(variants.get(true_sub, [TRUTH_SUB_TO_PRED[true_sub].upper()]))
        return v, f"subclass_variant:{v}"
    # class wrong, or tumour without truth subtype: subtype consistent with predicted class
    if pred_cls == "tumor":
        return rng.choice(TUMOR_PRED_SUBS), None
    return rng.choice(["ischemic", "hemorrhagic"]), None


def pred_modality(true_mod):
    r = rng.random()
    if r < 0.86:
        return rng.choice({"MRI": ["MRI", "MRI", "MRI", "MR", "mri", "MRI FLAIR"], "CT": ["CT", "CT", "ct"]}[true_mod]), None
    if r < 0.93:
        v = "CT" if true_mod == "MRI" else "MRI"
        return v, "modality_wrong"
    if r < 0.97:
        return None, "modality_null"
    v = "Magnetic Resonance Imaging"  # contains no 'mr' substring -> own label
    return v, "modality_variant_unmapped"


def pred_sequence(true_mod, true_seq, pred_mod):
    if true_mod == "CT" or pred_mod in ("CT", "ct"):
        r = rng.random()
        if r < 0.75:
            return None, None
        return rng.choice(["non-contrast", "N/A", "none"]), "ct_sequence_text"
    if not true_seq:  # MRI with unknown truth sequence (Br35H)
        return rng.choice(["T1C+", "T2", "T1", "FLAIR", None]), None
    r = rng.random()
    if r < 0.72:
        return true_seq, None
    if r < 0.84:
        return rng.choice([s for s in ["T1C+", "FLAIR", "T1", "T2", "DWI"] if s != true_seq]), "sequence_wrong"
    if r < 0.90:
        return None, "sequence_null"
    variants = {"T1C+": ["T1+C", "post-contrast T1", "T1 with contrast", "t1c+"],
                "T2": ["T2-weighted", "t2"], "T1": ["T1-weighted", "non-contrast"],
                "FLAIR": ["flair", "T2 FLAIR"]}
    v = rng.choice(variants[true_seq])
    return v, f"sequence_variant:{v}"


def pred_plane(true_plane):
    if not true_plane:
        return rng.choice(["axial", "axial", "axial", "sagittal", "coronal", None]), None
    r = rng.random()
    if r < 0.82:
        return rng.choice([true_plane, true_plane, true_plane.capitalize()]), None
    if r < 0.89:
        return ("sagittal" if true_plane == "axial" else "axial"), "plane_wrong"
    if r < 0.93:
        return "coronal", "plane_coronal"
    if r < 0.97:
        return None, "plane_null"
    v = "S" if true_plane == "sagittal" else " AXIAL "
    return v, f"plane_variant:{v!r}"


ICD = {"tumor": "D43.2", "stroke": "I63.9", "multiple sclerosis": "G35", "normal": None,
       "other abnormalities": "G93.9"}


def render(obj, style):
    if style == 0:
        return json.dumps(obj, ensure_ascii=False)
    if style == 1:
        return json.dumps(obj, indent=2, ensure_ascii=False)
    if style == 2:
        return "```json\n" + json.dumps(obj, indent=2, ensure_ascii=False) + "\n```"
    return ("Here is my structured interpretation of the scan:\n" + json.dumps(obj, indent=1, ensure_ascii=False)
            + "\nPlease correlate clinically.")


rows_out = []
eval_lines = []
for i, tr in enumerate(truth_rows):
    t = tr["truth"]
    true_cls = t["class"]
    # --- diagnosis_name
    class_correct = True
    if i in WRONG_CLASS:
        pred_cls = rng.choice([c for c in CLASSES if c != true_cls])
        class_correct = False
        note(i, f"class_wrong:{pred_cls}")
    else:
        pred_cls = true_cls
    dn_value = pred_cls
    if i in VAR_CLASS:
        k = VAR_CLASS.index(i)
        var_map = {
            "tumor": ["Tumor", "glioma", "brain tumor"],
            "stroke": ["Ischemic stroke", "STROKE", "hemorrhage"],
            "multiple sclerosis": ["Multiple_Sclerosis", "multiple sclerosis (MS)"],
            "normal": [" Normal ", "NORMAL"],
            "other abnormalities": ["Other_Abnormalities", "atrophy"],
        }
        dn_value = var_map[pred_cls][k % len(var_map[pred_cls])]
        note(i, f"class_variant:{dn_value!r}")
    # --- other fields
    sub_value, sn = pred_subclass(true_cls, t["subclass"], pred_cls, class_correct)
    if sn:
        note(i, sn)
    mod_value, mn = pred_modality(t["modality"])
    if mn:
        note(i, mn)
    seq_value, qn = pred_sequence(t["modality"], t["modality_subtype"], mod_value)
    if qn:
        note(i, qn)
    pl_value, pn = pred_plane(t["plane"])
    if pn:
        note(i, pn)
    # --- confidence
    if class_correct:
        conf = round(rng.uniform(0.45, 0.99), 2)
    else:
        conf = round(rng.uniform(0.02, 0.85), 2)
    conf_key_present = True
    if i in CONF_EDGE:
        conf = CONF_EDGE[i]
        note(i, f"conf_edge:{conf}")
    if i in CONF_MISSING:
        conf_key_present = False
        note(i, "conf_missing")
    elif i in CONF_NULL:
        conf = None
        note(i, "conf_null")
    elif i in CONF_STR_NUM:
        conf = "0.85"
        note(i, "conf_string_number")
    elif i in CONF_STR_TXT:
        conf = "high"
        note(i, "conf_string_text")
    elif i in CONF_OVER1:
        conf = 85
        note(i, "conf_85_clipped")

    obj = {
        "modality": mod_value,
        "specialized_sequence": seq_value,
        "plane": pl_value,
        "diagnosis_name": dn_value,
        "diagnosis_detailed": sub_value,
        "icd10_code": ICD.get(pred_cls),
        "severity_score": round(rng.uniform(0, 1), 2),
    }
    if conf_key_present:
        obj["diagnosis_confidence"] = conf
    obj["severity_confidence"] = round(rng.uniform(0.3, 0.95), 2)

    # --- abstentions on diagnosis_name
    if i in ABSTAIN:
        obj["diagnosis_detailed"] = None
        obj["icd10_code"] = None
    if i in AB_NULL:
        obj["diagnosis_name"] = None
        note(i, "abstain:null")
    elif i in AB_MISSING:
        del obj["diagnosis_name"]
        if AB_MISSING.index(i) == 0:
            del obj["diagnosis_detailed"]
        note(i, "abstain:key_missing")
    elif i in AB_UNDET:
        obj["diagnosis_name"] = "undetermined"
        note(i, "abstain:'undetermined'")
    elif i in AB_UNDET_CAPS:
        obj["diagnosis_name"] = " Undetermined "
        note(i, "abstain:' Undetermined '")
    elif i in AB_NULLSTR:
        obj["diagnosis_name"] = "null"
        note(i, "abstain:'null' string")
    elif i in AB_EMPTY:
        obj["diagnosis_name"] = ""
        note(i, "abstain:empty string")
    elif i in NONE_STR:
        obj["diagnosis_name"] = "None"
        obj["diagnosis_detailed"] = None
        note(i, "class_'None'_string (NOT undetermined in their normaliser)")

    style = rng.choices([0, 1, 2, 3], weights=[40, 25, 25, 10])[0]
    raw = render(obj, style)
    if i in AB_GARBAGE:
        raw = "I'm sorry, but I can't provide a diagnosis from this image alone. Please consult a radiologist."
        note(i, "abstain:garbage_no_braces")
    elif i in AB_TRUNC:
        raw = '```json\n{\n  "modality": "MRI",\n  "plane": "axial",\n  "diagnosis_name": "tumor",\n  "diagnosis_detailed": "glioma",\n  "diagnosis_confidence": 0.8'
        note(i, "abstain:truncated_json")
    elif i in AB_TWOOBJ:
        raw = ('Primary: {"modality": "MRI", "plane": "axial", "diagnosis_name": "tumor", "diagnosis_confidence": 0.7}\n'
               'Alternative: {"diagnosis_name": "stroke", "diagnosis_confidence": 0.3}')
        note(i, "abstain:two_json_objects")
    elif i in AB_PYDICT:
        raw = "{'modality': 'MRI', 'plane': 'axial', 'diagnosis_name': 'normal', 'diagnosis_confidence': 0.9}"
        note(i, "abstain:single_quoted_dict")
    elif i in AB_NONE:
        raw = None
        note(i, "abstain:response_None")
    else:
        note(i, f"style:{style}")

    exp_id = f"neurorad_{i:06d}"
    rows_out.append({
        "id": exp_id,
        "dataset": tr["dataset"],
        "file_path": tr["file_path"],
        "truth": t,
        "response": raw,
    })
    ptok = rng.randint(900, 1600)
    ctok = rng.randint(60, 220)
    eval_lines.append({
        "timestamp": "2026-03-25T12:00:00",
        "experiment_id": exp_id,
        "api_response": {"id": f"gen-{i:06d}", "model": MODEL, "prompt_tokens": ptok,
                         "completion_tokens": ctok, "total_tokens": ptok + ctok},
        "input": {
            "image_path": f"../../ivan/dataset/{tr['file_path']}",
            "model_requested": MODEL,
            "system_prompt_type": "neurorad_prompt_trim",
            "metadata": {
                "dataset": tr["dataset"],
                "class": t["class"],
                "subclass": t["subclass"],
                "modality": t["modality"],
                "modality_subtype": t["modality_subtype"],
                "axial_plane": t["plane"],
            },
        },
        "output": {"parsed_response": parse_json_response(raw), "status": "success", "error": None},
        "processing": {"row_index": i + 1, "parameters": {"temperature": 0, "seed": 42}},
    })

for i in WHOLE_PARSE_FAIL:  # whole response unparseable: every field is missing, drop field-level notes
    notes[i] = [s for s in notes[i] if s.startswith("abstain")] + ["all_fields_missing(parse_error_dict)"]

os.makedirs(EVAL_IN_DIR, exist_ok=True)
with open(os.path.join(OUT_DIR, "rows.jsonl"), "w", encoding="utf-8") as f:
    for r in rows_out:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
with open(os.path.join(EVAL_IN_DIR, "synthetic_200.jsonl"), "w", encoding="utf-8") as f:
    for r in eval_lines:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
with open(os.path.join(OUT_DIR, "row_notes.json"), "w", encoding="utf-8") as f:
    json.dump({rows_out[i]["id"]: v for i, v in sorted(notes.items())}, f, indent=1, ensure_ascii=False)
print("wrote", len(rows_out), "rows")
