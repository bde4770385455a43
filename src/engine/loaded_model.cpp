#include "engine/loaded_model.h"

#include "core/error.h"
#if QSPEC_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qspec {

std::unique_ptr<Backend> make_backend(const std::string& name,
                                      [[maybe_unused]] const BackendOptions& options) {
  if (name == "cpu") return make_cpu_backend();  // nothing in the options concerns the CPU
#if QSPEC_HAVE_CUDA
  if (name == "cuda") return make_cuda_backend(options);
  constexpr const char* available = "cpu, cuda";
#else
  constexpr const char* available = "cpu (built without CUDA)";
#endif
  fail("--backend: unknown or unavailable backend '{}' (available: {})", name, available);
}

LoadedModel LoadedModel::open(const std::string& dir, const std::string& backend_name,
                              const BackendOptions& backend_options) {
  LoadedModel loaded;
  Qwen35Config config = Qwen35Config::load(dir);
  loaded.store = std::make_unique<TensorStore>(TensorStore::open_dir(dir));
  loaded.backend = make_backend(backend_name, backend_options);
  loaded.model = std::make_unique<Qwen35Model>(std::move(config), *loaded.store, *loaded.backend);
  return loaded;
}

LoadedDrafter LoadedDrafter::open(const std::string& dir, const LoadedModel& target,
                                  const std::string& target_dir, DraftHead head) {
  LoadedDrafter loaded;
  DFlashConfig config = DFlashConfig::load(dir);
  // Its block is a verify step's rows, which the target's GDN replay takes up to kGdnReplayMaxRows.
  if (config.block_size > kGdnReplayMaxRows)
    fail("{}: block_size {} is above the {} rows a verify step of the target takes", config.source,
         config.block_size, kGdnReplayMaxRows);
  loaded.store = std::make_unique<TensorStore>(TensorStore::open_dir(dir));
  loaded.model =
      std::make_unique<DFlashModel>(std::move(config), *loaded.store, *target.model, target_dir, head);
  return loaded;
}

}  // namespace qspec
