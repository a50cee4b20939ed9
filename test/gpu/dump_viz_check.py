# Loads a vpmm-dump --torch-snapshot file and runs PyTorch's own memory_viz
# code over it: segsum (asserts blocks add up to each segment), trace, and
# the HTML of the visualizer (which embeds the pickle for its JS unpickler).
import pickle, sys
from torch.cuda import _memory_viz as mv
snap = pickle.load(open(sys.argv[1], "rb"))
print("segments", len(snap["segments"]), "trace entries", [len(t) for t in snap["device_traces"]])
print(mv.segsum(snap))
print(mv.trace(snap)[:2000])
html = mv.trace_plot(snap)
open(sys.argv[2], "w").write(html)
print("html bytes", len(html))
