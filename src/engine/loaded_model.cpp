#include "engine/loaded_model.h"

#include "core/error.h"
#if QSPEC_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qspec {

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
#if QSPEC_HAVE_CUDA
  if (name == "cuda") return make_cuda_backend();
  constexpr const char* available = "cpu, cuda";
#else
  constexpr const char* available = "cpu (built without CUDA)";
#endif
  fail("--backend: unknown or unavailable backend '{}' (available: {})", name, available);
}

LoadedModel LoadedModel::open(const std::string& dir, const std::string& backend_name) {
  LoadedModel loaded;
  Qwen35Config config = Qwen35Config::load(dir);
  loaded.store = std::make_unique<TensorStore>(TensorStore::open_dir(dir));
  loaded.backend = make_backend(backend_name);
  loaded.model = std::make_unique<Qwen35Model>(std::move(config), *loaded.store, *loaded.backend);
  return loaded;
}

LoadedDrafter LoadedDrafter::open(const std::string& dir, const LoadedModel& target,
                                  const std::string& target_dir) {
  LoadedDrafter loaded;
  DFlashConfig config = DFlashConfig::load(dir);
  loaded.store = std::make_unique<TensorStore>(TensorStore::open_dir(dir));
  loaded.model = std::make_unique<DFlashModel>(std::move(config), *loaded.store, *target.model, target_dir);
  return loaded;
}

}  // namespace qspec
