// What a plugin of kind scaler includes: a loss scaler.
#pragma once

#include <ampkit/descriptor.h>
#include <ampkit/loss_scaler.h>
