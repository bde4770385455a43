#include "backend/ops.h"

#include "core/error.h"

namespace qspec {

std::unique_ptr<StepGraph> Backend::capture(const std::function<void()>&) {
  fail("backend {} cannot record step graphs", name());
}

}  // namespace qspec
