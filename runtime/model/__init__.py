"""Model execution: loading (loader.py, gguf_file.py with gguf_blocks.py, hf_folder.py), the Llama-family
model (llama.py, layers.py, rotary.py), quantized weights (quantization.py), attention backends
(attention/), the compiled CPU decode graph (cpu_graph.py), CUDA graphs (cuda_graph.py), tensor parallelism
(distributed.py), and the runner that turns a ForwardBatch into logits (runner.py)."""
