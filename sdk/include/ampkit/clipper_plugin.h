// What a plugin of kind clipper includes: a gradient clipper; includes ATen (the interface passes tensors).
#pragma once

#include <ampkit/descriptor.h>
#include <ampkit/grad_clipper.h>
