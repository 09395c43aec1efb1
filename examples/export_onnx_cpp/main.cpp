// Inference on an exported pointformers ONNX file with the onnxruntime C++ API: one point cloud
// in, one output row per point out. What run_onnx.py does in Python, for C++ applications.
//
//   ./pointformers_infer MODEL.onnx X.f32 COORDS.f32 OUT.f32
//
// X.f32 and COORDS.f32 hold one cloud as raw float32 (native byte order, row-major) of shapes
// (N, F) and (N, c); F and c are read from the model's input shapes, N from the file sizes. The
// output (N, out_dim) is written to OUT.f32 the same way. The file must have been exported in
// float32 (export_model's default) and N must be at least the file's "min_points" (its metadata).
//
// Build: CMakeLists.txt beside this file (README.md, "C++").
#include <onnxruntime_cxx_api.h>

#include <cstdint>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("cannot open " + path);
  const std::streamsize bytes = in.tellg();
  if (bytes % static_cast<std::streamsize>(sizeof(float)) != 0)
    throw std::runtime_error(path + ": size is not a multiple of 4 bytes");
  std::vector<float> data(static_cast<size_t>(bytes) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(data.data()), bytes);
  return data;
}

// The width of input `index`: its shape is [n_points, width] with n_points dynamic (-1).
int64_t input_width(Ort::Session& session, size_t index) {
  Ort::TypeInfo type = session.GetInputTypeInfo(index);
  auto tensor = type.GetTensorTypeAndShapeInfo();
  if (tensor.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
    throw std::runtime_error("this program reads float32 models; export with dtype=torch.float32");
  return tensor.GetShape().at(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: " << argv[0] << " MODEL.onnx X.f32 COORDS.f32 OUT.f32\n";
    return 2;
  }
  try {
    // One environment per process, one session per model (a session can be run from many threads).
    Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "pointformers");  // errors only (no constant-folding notices)
    Ort::SessionOptions options;
    options.SetIntraOpNumThreads(1);
    Ort::Session session(env, argv[1], options);  // the path is a char string on Linux and macOS

    // Names: the inputs are "x" and "coords" in every file export_model writes; the output's
    // name is read from the session.
    Ort::AllocatorWithDefaultOptions allocator;
    Ort::AllocatedStringPtr output_name = session.GetOutputNameAllocated(0, allocator);
    const char* input_names[] = {"x", "coords"};
    const char* output_names[] = {output_name.get()};

    // The cloud: N points, F features and c coordinates each.
    const int64_t F = input_width(session, 0), C = input_width(session, 1);
    std::vector<float> x = read_floats(argv[2]), coords = read_floats(argv[3]);
    const int64_t n = static_cast<int64_t>(x.size()) / F;
    if (static_cast<int64_t>(x.size()) != n * F || static_cast<int64_t>(coords.size()) != n * C)
      throw std::runtime_error("inputs: expected " + std::to_string(F) + " features and " + std::to_string(C) +
                               " coordinates per point");

    // Tensors that wrap the vectors (no copy), then one run.
    Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    const int64_t x_shape[] = {n, F};
    const int64_t coords_shape[] = {n, C};
    std::vector<Ort::Value> inputs;
    inputs.push_back(Ort::Value::CreateTensor<float>(memory, x.data(), x.size(), x_shape, 2));
    inputs.push_back(Ort::Value::CreateTensor<float>(memory, coords.data(), coords.size(), coords_shape, 2));
    std::vector<Ort::Value> outputs =
        session.Run(Ort::RunOptions{nullptr}, input_names, inputs.data(), inputs.size(), output_names, 1);

    // The output: (N, out_dim) float32.
    auto info = outputs[0].GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> shape = info.GetShape();
    const float* out = outputs[0].GetTensorData<float>();
    std::ofstream(argv[4], std::ios::binary)
        .write(reinterpret_cast<const char*>(out), static_cast<std::streamsize>(info.GetElementCount() * sizeof(float)));
    std::cout << "C++ onnxruntime: " << n << " points -> " << output_names[0] << " (" << shape[0];
    for (size_t i = 1; i < shape.size(); ++i) std::cout << ", " << shape[i];
    std::cout << ")\n";
  } catch (const Ort::Exception& e) {
    std::cerr << "onnxruntime error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
