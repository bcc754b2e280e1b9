#!/usr/bin/env python3
"""Driver: runs the UNCHANGED repo/evaluate_detailed.py functions exactly as its main() does
(load_jsonl -> evaluate(data, 'results/all_<name>') -> write_csv(results, 'results/all_<name>.csv'),
then the same per-dataset loop), but on our input file instead of main()'s hard-coded list.
Additionally dumps the in-memory `results` dict (which main() never writes) as JSON.
Must be run with CWD=/tmp/nvb_eval/output (their code saves PDFs to results/confusion_matrix/)."""
import json, os, sys
import numpy as np
sys.path.insert(0, "/tmp/nvb_eval/repo")
import evaluate_detailed as ed

name = sys.argv[1] if len(sys.argv) > 1 else "synthetic_200"
jsonl_file_name = f"/tmp/nvb_eval/chatmed/results/{name}.jsonl"
os.makedirs("results/confusion_matrix", exist_ok=True)

def conv(o):
    if isinstance(o, dict): return {str(k): conv(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)): return [conv(v) for v in o]
    if isinstance(o, np.ndarray): return conv(o.tolist())
    if isinstance(o, (np.floating,)): o = float(o)
    if isinstance(o, (np.integer,)): return int(o)
    if isinstance(o, (np.bool_,)): return bool(o)
    if isinstance(o, float) and o != o: return "NaN"
    return o

data = ed.load_jsonl(jsonl_file_name)
print(f"Loaded {len(data)} samples from {name}")
results = ed.evaluate(data, 'results/all_' + name)
ed.write_csv(results, 'results/all_' + name + '.csv')
json.dump(conv(results), open('results/all_' + name + '.results.json', 'w'), indent=1, ensure_ascii=False)

datasets = ['images-17','images-44c', 'figshare', 'stroke', 'sclerosis', 'aisd', 'Br35H']
for dataset in datasets:
    data_dataset = ed.load_jsonl(jsonl_file_name, dataset)
    print(f"Loaded {len(data_dataset)} samples from {name}")
    results_dataset = ed.evaluate(data_dataset, 'results/' + dataset + '_' + name)
    ed.write_csv(results_dataset, 'results/' + dataset + '_' + name + '.csv')
    json.dump(conv(results_dataset), open('results/' + dataset + '_' + name + '.results.json', 'w'), indent=1, ensure_ascii=False)
