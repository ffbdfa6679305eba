// graph.cu: CUDA graphs on remax's stream: capture the work a sequence of launches queues, then
// replay it with one call (generation's decode step: engine/generate/generate.c). Under the
// emulator the stream records the launches and copies and the replay submits them again.
#include "common.cuh"

extern "C" int rx_cuda_graph_begin(void) {
  RX_STREAM(s);
  RX_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "graph", "%s", "begin capture");
  return RX_OK;
}

extern "C" int rx_cuda_graph_end(void **exec) {
  *exec = NULL;
  RX_STREAM(s);
  cudaGraph_t graph = NULL;
  RX_CU(cudaStreamEndCapture(s, &graph), "graph", "%s", "end capture");
  cudaGraphExec_t ge = NULL;
  cudaError_t e = cudaGraphInstantiate(&ge, graph, 0);
  cudaGraphDestroy(graph);
  RX_CU(e, "graph", "%s", "instantiate");
  *exec = ge;
  return RX_OK;
}

extern "C" int rx_cuda_graph_launch(void *exec) {
  RX_STREAM(s);
  RX_CU(cudaGraphLaunch((cudaGraphExec_t)exec, s), "graph", "%s", "launch");
  RX_LAUNCHED("graph", "%s", "replay");
  return RX_OK;
}

extern "C" void rx_cuda_graph_free(void *exec) {
  if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}
