// Everything a plugin of any kind may need: the descriptor and AMPKIT_PLUGIN (descriptor.h) and
// the interfaces of every kind. A plugin of one kind compiles faster with its own header instead:
// ampkit/scaler_plugin.h, clipper_plugin.h, nan_policy_plugin.h, comm_plugin.h, fp8_recipe_plugin.h.
#pragma once

#include <ampkit/comm_backend.h>
#include <ampkit/descriptor.h>
#include <ampkit/fp8_recipe.h>
#include <ampkit/grad_clipper.h>
#include <ampkit/loss_scaler.h>
#include <ampkit/nan_policy.h>
