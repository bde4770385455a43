// A checkpoint directory opened on a backend: the mapped tensors, the backend and the model, owned together
// because the model's CPU weights are views of the mapping.
#pragma once

#include <memory>
#include <string>

#include "backend/ops.h"
#include "io/safetensors.h"
#include "model/dflash.h"
#include "model/qwen35.h"

namespace qspec {

struct LoadedModel {
  std::unique_ptr<TensorStore> store;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Qwen35Model> model;

  // backend_name: "cpu" (or "cuda" when built with it); throws Error naming the directory, file or field.
  static LoadedModel open(const std::string& dir, const std::string& backend_name,
                          const BackendOptions& backend_options = {});
};

// A DFlash drafter directory opened on its target's backend, validated against the target.
struct LoadedDrafter {
  std::unique_ptr<TensorStore> store;
  std::unique_ptr<DFlashModel> model;

  // Throws Error naming the drafter's directory, file or field (or the mismatch with the target at
  // target_dir).
  static LoadedDrafter open(const std::string& dir, const LoadedModel& target, const std::string& target_dir,
                            DraftHead head = DraftHead::Target);
};

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options);

}  // namespace qspec
